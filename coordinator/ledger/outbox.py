"""The alert outbox: alerts written in the same transaction as the transitions they
report, so a committed transition always has its alert, even when the coordinator dies
before publishing it.

`OutboxWriter` adds rows inside a unit of work (a node change set, a booking's unit of
work); `OutboxRepo` is the relay's side: the unsent rows in the order they were
written, marking them sent once JetStream acknowledged them, the backlog for metrics,
and dropping sent rows after a while. Rows keep the alert's JSON as published, so a
row published twice (after a leader change) is the same message, which the stream
de-duplicates by its id.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import msgspec
from sqlalchemy import delete, func, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.ledger import schema
from coordinator.ledger.database import Database
from shared.wire import Alert


@dataclass(frozen=True, slots=True)
class PendingAlert:
    seq: int
    alert: Alert
    created_at: int
    attempts: int


@dataclass(frozen=True, slots=True)
class OutboxBacklog:
    unsent: int
    oldest_created_at: int | None  # None: nothing unsent


class OutboxWriter:
    """Adds alerts to the outbox on the caller's connection (its transaction)."""

    def __init__(self, conn: AsyncConnection) -> None:
        self._conn = conn

    async def add(self, alerts: Iterable[Alert]) -> None:
        rows = [
            {
                "alert_id": a.alert_id,
                "payload": a.to_json().decode(),
                "created_at": a.at,
                "attempts": 0,
            }
            for a in await with_pool_names(self._conn, alerts)
        ]
        if rows:
            await self._conn.execute(schema.alert_outbox.insert(), rows)


async def with_pool_names(conn: AsyncConnection, alerts: Iterable[Alert]) -> list[Alert]:
    """The alerts with their pool's name in `details.poolName` (issue 34: an operator
    routes on names, not ids), read in the transaction that writes them; an alert of a
    pool the ledger does not know is left as it is."""
    out = list(alerts)
    ids = sorted({a.pool_id for a in out if a.pool_id})
    if not ids:
        return out
    p = schema.pools.c
    rows = await conn.execute(select(p.pool_id, p.name).where(p.pool_id.in_(ids)))
    names = {r.pool_id: r.name for r in rows.all()}
    return [
        msgspec.structs.replace(a, details={**a.details, "poolName": names[a.pool_id]})
        if a.pool_id in names and "poolName" not in a.details
        else a
        for a in out
    ]


class OutboxRepo:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def unsent(self, limit: int) -> list[PendingAlert]:
        """The oldest unsent alerts, in the order they were written."""
        o = schema.alert_outbox.c
        async with self._db.read() as conn:
            rows = await conn.execute(
                select(o.seq, o.payload, o.created_at, o.attempts)
                .where(o.sent_at.is_(None))
                .order_by(o.seq)
                .limit(limit)
            )
            return [
                PendingAlert(r.seq, Alert.from_json(r.payload), r.created_at, r.attempts)
                for r in rows.all()
            ]

    async def mark_sent(self, seqs: Sequence[int], now: int) -> int:
        """Record that these rows were acknowledged; returns how many were still unsent."""
        if not seqs:
            return 0
        o = schema.alert_outbox.c
        async with self._db.transaction() as conn:
            result = await conn.execute(
                update(schema.alert_outbox)
                .where(o.seq.in_(list(seqs)) & o.sent_at.is_(None))
                .values(sent_at=now)
            )
            return int(result.rowcount)

    async def note_attempt(self, seq: int) -> None:
        """One more failed try at publishing this row."""
        o = schema.alert_outbox.c
        async with self._db.transaction() as conn:
            await conn.execute(
                update(schema.alert_outbox).where(o.seq == seq).values(attempts=o.attempts + 1)
            )

    async def backlog(self) -> OutboxBacklog:
        o = schema.alert_outbox.c
        async with self._db.read() as conn:
            row = (
                await conn.execute(
                    select(func.count(), func.min(o.created_at)).where(o.sent_at.is_(None))
                )
            ).one()
            return OutboxBacklog(int(row[0]), None if row[1] is None else int(row[1]))

    async def purge_sent(self, before: int) -> int:
        """Drop rows sent before `before`; returns how many."""
        o = schema.alert_outbox.c
        async with self._db.transaction() as conn:
            result = await conn.execute(
                delete(schema.alert_outbox).where(o.sent_at.is_not(None) & (o.sent_at < before))
            )
            return int(result.rowcount)
