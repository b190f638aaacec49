"""Idempotency records: (tenant, endpoint, key) → body hash and the first response.

The record is written in the same transaction as the booking it answers, under a
primary key, so two concurrent duplicates cannot both commit: the loser re-reads and
replays. `purge` drops records past the retention its caller keeps (the coordinator's
`idempotency-purge` loop: at least the 24 h the SPEC promises).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.errors import IdempotencyKeyConflict
from coordinator.ledger import schema
from coordinator.ledger.database import Database


def body_hash(body: Any) -> str:
    """sha256 of the canonical JSON (sorted keys, no spaces) of a request body."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Recorded:
    status: int
    response: Any


async def lookup(
    conn: AsyncConnection, tenant_id: str, endpoint: str, key: str, digest: str
) -> Recorded | None:
    """The recorded answer for this key, None if there is none; a different body under
    the same key is IDEMPOTENCY_KEY_CONFLICT."""
    i = schema.idempotency.c
    row = (
        await conn.execute(
            select(i.body_hash, i.status, i.response).where(
                (i.tenant_id == tenant_id) & (i.endpoint == endpoint) & (i.key == key)
            )
        )
    ).first()
    if row is None:
        return None
    if row.body_hash != digest:
        raise IdempotencyKeyConflict(
            f"idempotency key {key!r} was used with a different request body",
            {"idempotencyKey": key},
        )
    return Recorded(row.status, row.response)


async def store(
    conn: AsyncConnection,
    tenant_id: str,
    endpoint: str,
    key: str,
    digest: str,
    status: int,
    response: Any,
    now: int,
) -> None:
    await conn.execute(
        schema.idempotency.insert().values(
            tenant_id=tenant_id,
            endpoint=endpoint,
            key=key,
            body_hash=digest,
            status=status,
            response=response,
            created_at=now,
        )
    )


async def record_once(
    db: Database,
    tenant_id: str,
    endpoint: str,
    key: str,
    digest: str,
    status: int,
    response: Any,
    now: int,
) -> Recorded:
    """Record an answer that wrote nothing else (a 409); if a concurrent request
    recorded first, theirs is the answer."""
    try:
        async with db.transaction() as conn:
            found = await lookup(conn, tenant_id, endpoint, key, digest)
            if found is not None:
                return found
            await store(conn, tenant_id, endpoint, key, digest, status, response, now)
            return Recorded(status, response)
    except IntegrityError:
        async with db.read() as conn:
            found = await lookup(conn, tenant_id, endpoint, key, digest)
        assert found is not None
        return found


async def purge(db: Database, now: int, keep_ms: int) -> int:
    """Drop the records created more than `keep_ms` before `now`; returns how many."""
    async with db.transaction() as conn:
        result = await conn.execute(
            delete(schema.idempotency).where(schema.idempotency.c.created_at < now - keep_ms)
        )
    return int(result.rowcount or 0)
