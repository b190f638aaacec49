"""Idempotency records: (tenant, endpoint, key) → body hash and the first response.

The record is written in the same unit of work as the booking it answers, under a
primary key, so two concurrent duplicates cannot both commit: the loser's unit of work
raises `WriteRaced`, and on retry it finds the winner's record and replays it. What is
stored is the answer as first given (status and JSON body), so a replay is that answer
verbatim; the ledger stores it and never words it. `purge`, driven by the coordinator's
`idempotency-purge` loop, drops records past the retention it keeps (at least 24 hours).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import Select, bindparam, delete, select
from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.domain.idempotency import Recorded, Stored, matching
from coordinator.ledger import schema
from coordinator.ledger.bulk import insert_many
from coordinator.ledger.database import Database


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
    return matching(Stored(row.body_hash, Recorded(row.status, row.response)), key, digest)


def _lookup_many_select() -> Select[Any]:
    i = schema.idempotency.c
    return select(i.tenant_id, i.key, i.body_hash, i.status, i.response).where(
        (i.endpoint == bindparam("w_endpoint"))
        & i.tenant_id.in_(bindparam("w_tenants", expanding=True))
        & i.key.in_(bindparam("w_keys", expanding=True))
    )


# Built once: every batch of creates looks its keys up (building the statement and its
# cache key again cost more than running it).
_LOOKUP_MANY = _lookup_many_select()


async def lookup_many(
    conn: AsyncConnection, endpoint: str, keys: Iterable[tuple[str, str]]
) -> dict[tuple[str, str], Stored]:
    """(tenant, key) → the answer stored and its body's hash, of those recorded, in one
    query."""
    wanted = set(keys)
    if not wanted:
        return {}
    rows = await conn.execute(
        _LOOKUP_MANY,
        {
            "w_endpoint": endpoint,
            "w_tenants": sorted({t for t, _ in wanted}),
            "w_keys": sorted({k for _, k in wanted}),
        },
    )
    return {
        (row.tenant_id, row.key): Stored(row.body_hash, Recorded(row.status, row.response))
        for row in rows.all()
        if (row.tenant_id, row.key) in wanted
    }


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


async def store_many(
    conn: AsyncConnection,
    endpoint: str,
    answers: Iterable[tuple[str, str, str, Recorded]],
    now: int,
) -> None:
    """Record (tenant, key, body hash, answer) of many requests in one statement."""
    rows = [
        {
            "tenant_id": tenant_id,
            "endpoint": endpoint,
            "key": key,
            "body_hash": digest,
            "status": answer.status,
            "response": answer.response,
            "created_at": now,
        }
        for tenant_id, key, digest, answer in answers
    ]
    await insert_many(conn, schema.idempotency, rows)


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
