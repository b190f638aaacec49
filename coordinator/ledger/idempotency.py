"""Idempotency records: (tenant, endpoint, key) → body hash and the first response.

The record is written in the same unit of work as the booking it answers, under a
primary key, so two concurrent duplicates cannot both commit: the loser's unit of work
raises `WriteRaced`, and on retry it finds the winner's record and replays it. What is
stored is the answer as first given (status and JSON body), so a replay is that answer
verbatim; the ledger stores it and never words it. `purge`, driven by the coordinator's
`idempotency-purge` loop, drops records past the retention it keeps (at least 24 hours).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, select
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


async def recorded(
    db: Database, tenant_id: str, endpoint: str, key: str, digest: str
) -> Recorded | None:
    """`lookup` outside any unit of work: a retry is answered from its record before
    the request is validated again (its start may have passed since)."""
    async with db.read() as conn:
        return await lookup(conn, tenant_id, endpoint, key, digest)


async def purge(db: Database, now: int, keep_ms: int) -> int:
    """Drop the records created more than `keep_ms` before `now`; returns how many."""
    async with db.transaction() as conn:
        result = await conn.execute(
            delete(schema.idempotency).where(schema.idempotency.c.created_at < now - keep_ms)
        )
    return int(result.rowcount or 0)
