"""Idempotency as a rule: a request body's hash, the answer recorded under a key, and
when a stored answer may replay.

A retry under the same key with the same body gets the first answer verbatim; the same
key with another body is IDEMPOTENCY_KEY_CONFLICT. Where the records are kept (and for
how long) is the ledger's (`coordinator/ledger/idempotency.py`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from coordinator.domain.errors import IdempotencyKeyConflict


def body_hash(body: Any) -> str:
    """sha256 of the canonical JSON (sorted keys, no spaces) of a request body."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Recorded:
    """An answer as first given: its HTTP status and JSON body."""

    status: int
    response: Any


@dataclass(frozen=True, slots=True)
class Stored:
    """An answer as recorded under a key, with the hash of the body it answered."""

    digest: str
    answer: Recorded


def matching(stored: Stored, key: str, digest: str) -> Recorded:
    """The answer stored under `key`, if `digest` is the hash of the body it answered."""
    if stored.digest != digest:
        raise IdempotencyKeyConflict(
            f"idempotency key {key!r} was used with a different request body",
            {"idempotencyKey": key},
        )
    return stored.answer
