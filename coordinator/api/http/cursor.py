"""Opaque, URL-safe pagination cursors (base64url of a small JSON value).

Opaque to clients, but a client can forge one: every decoded value is checked for the
shape and range we issue before it reaches a query (a float, `true` or an integer
beyond 64 bits would otherwise fail in the database, as a 500).
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from coordinator.api.http.body import BodyError, strict_json
from coordinator.domain.errors import InvalidInput

MAX_TIME_MS = 2**63 - 1


def encode_cursor(value: Any) -> str:
    raw = json.dumps(value, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _invalid(field: str) -> InvalidInput:
    return InvalidInput(
        "invalid cursor", {"fields": [{"path": field, "message": "not a cursor we issued"}]}
    )


def decode_cursor(cursor: str, field: str = "cursor") -> Any:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        return strict_json(base64.urlsafe_b64decode(padded.encode()))
    except (binascii.Error, ValueError, UnicodeDecodeError, BodyError):
        raise _invalid(field) from None


def decode_time_cursor(cursor: str, field: str = "cursor") -> tuple[int, str]:
    """A `[createdAt, id]` cursor: a non-negative 64-bit integer and a short id."""
    value = decode_cursor(cursor, field)
    if not (isinstance(value, list) and len(value) == 2):
        raise _invalid(field)
    at, ident = value
    if isinstance(at, bool) or not isinstance(at, int) or not 0 <= at <= MAX_TIME_MS:
        raise _invalid(field)
    if not isinstance(ident, str) or not 0 < len(ident) <= 128:
        raise _invalid(field)
    return at, ident


def decode_id_cursor(cursor: str, field: str = "cursor") -> str:
    """A cursor that is one id (a string of at most 128 characters)."""
    value = decode_cursor(cursor, field)
    if not isinstance(value, str) or not 0 < len(value) <= 128:
        raise _invalid(field)
    return value


def decode_key_cursor(cursor: str, field: str = "cursor") -> tuple[str, str]:
    """A `[id, id]` cursor (a node and one of its atoms): ids of at most 256 characters."""
    value = decode_cursor(cursor, field)
    if not (isinstance(value, list) and len(value) == 2):
        raise _invalid(field)
    first, second = value
    for ident in value:
        if not isinstance(ident, str) or not 0 < len(ident) <= 256:
            raise _invalid(field)
    return first, second
