"""Interval reservations in the ledger: per-quarter usage, the write (inside a unit of
work), the audit list and the calendar's numbers.

The writer runs under the pool lock (PostgreSQL advisory lock; SQLite has one writer),
so parallel writes for the same interval serialize; the loser sees the winner's bookings
and answers with the updated reservableGb.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Sequence

from sqlalchemy import and_, or_, select
from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.domain.intervals import (
    INTERVAL_MS,
    Interval,
    IntervalReservation,
    QuarterUsage,
)
from coordinator.ledger import schema
from coordinator.ledger.database import Database
from coordinator.ledger.rollups import refresh_booked
from coordinator.ledger.snapshot import bump

RESOURCE = "memoryGiB"


async def usage(
    conn: AsyncConnection, tenant_id: str, pool_id: str, quarters: Sequence[int]
) -> dict[int, QuarterUsage]:
    """For each quarter start: the tenant's limit, its reserved GB, and the pool's free
    memory after every booking (interval ones and node-level memory of compute ones)."""
    if not quarters:
        return {}
    lo, hi = min(quarters), max(quarters) + INTERVAL_MS
    q, r, s = schema.quotas.c, schema.rollup.c, schema.scalar_bookings.c
    allocatable = (
        await conn.execute(
            select(r.allocatable).where((r.pool_id == pool_id) & (r.resource == RESOURCE))
        )
    ).scalar_one_or_none() or 0
    quotas = dict(
        (
            await conn.execute(
                select(q.pool_id, q.limit).where(
                    (q.tenant_id == tenant_id)
                    & (q.resource == RESOURCE)
                    & q.pool_id.in_(["", pool_id])
                )
            )
        ).all()
    )
    limit = int(quotas.get(pool_id, quotas.get("", allocatable)))
    pool_used: dict[int, int] = defaultdict(int)
    tenant_used: dict[int, int] = defaultdict(int)
    rows = await conn.execute(
        select(s.tenant_id, s.node_id, s.amount, s.start, s.end).where(
            (s.pool_id == pool_id) & (s.resource == RESOURCE) & (s.start < hi) & (s.end > lo)
        )
    )
    wanted = set(quarters)
    for owner, node_id, amount, start, end in rows.all():
        first = max(lo, start - start % INTERVAL_MS)
        for quarter in range(first, min(end, hi), INTERVAL_MS):
            if quarter in wanted:
                pool_used[quarter] += int(amount)
                if owner == tenant_id and node_id == "":
                    tenant_used[quarter] += int(amount)
    return {
        quarter: QuarterUsage(limit, tenant_used[quarter], max(0, allocatable - pool_used[quarter]))
        for quarter in quarters
    }


class IntervalRepo:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def reservable(
        self, tenant_id: str, pool_id: str, quarters: Sequence[int]
    ) -> dict[int, QuarterUsage]:
        async with self._db.read() as conn:
            return await usage(conn, tenant_id, pool_id, quarters)

    async def page(
        self,
        tenant_id: str,
        start: int,
        end: int,
        before: tuple[int, str] | None,
        limit: int,
    ) -> list[IntervalReservation]:
        """The audit list: createdAt in [start, end), newest first, ties by id descending."""
        c = schema.interval_reservations.c
        cond = (c.tenant_id == tenant_id) & (c.created_at >= start) & (c.created_at < end)
        if before is not None:
            created, rid = before
            cond &= or_(
                c.created_at < created, and_(c.created_at == created, c.reservation_id < rid)
            )
        async with self._db.read() as conn:
            rows = await conn.execute(
                select(schema.interval_reservations)
                .where(cond)
                .order_by(c.created_at.desc(), c.reservation_id.desc())
                .limit(limit)
            )
            return [
                IntervalReservation(
                    row.reservation_id,
                    row.tenant_id,
                    row.pool_id,
                    row.created_at,
                    tuple(
                        Interval(i["startsAt"], i["endsAt"], i["capacityGb"]) for i in row.intervals
                    ),
                )
                for row in rows.all()
            ]


class IntervalWriter:
    """Interval bookings inside a unit of work (which holds the pool lock)."""

    def __init__(self, conn: AsyncConnection) -> None:
        self._conn = conn

    async def usage(
        self, tenant_id: str, pool_id: str, quarters: Sequence[int]
    ) -> dict[int, QuarterUsage]:
        return await usage(self._conn, tenant_id, pool_id, quarters)

    async def book(
        self, tenant_id: str, pool_id: str, intervals: Sequence[Interval], now: int
    ) -> IntervalReservation:
        """Book every interval (the caller has checked that they fit, under the lock)."""
        conn = self._conn
        res = IntervalReservation(str(uuid.uuid4()), tenant_id, pool_id, now, tuple(intervals))
        await conn.execute(
            schema.interval_reservations.insert().values(
                reservation_id=res.reservation_id,
                tenant_id=tenant_id,
                pool_id=pool_id,
                created_at=now,
                intervals=[
                    {"startsAt": iv.starts_at, "endsAt": iv.ends_at, "capacityGb": iv.capacity_gb}
                    for iv in intervals
                ],
            )
        )
        await conn.execute(
            schema.scalar_bookings.insert(),
            [
                {
                    "reservation_id": res.reservation_id,
                    "tenant_id": tenant_id,
                    "pool_id": pool_id,
                    "node_id": "",
                    "resource": RESOURCE,
                    "amount": iv.capacity_gb,
                    "spot": False,
                    "start": iv.starts_at,
                    "end": iv.ends_at,
                }
                for iv in intervals
            ],
        )
        await bump(conn, [pool_id], bookings=True)
        await refresh_booked(conn, pool_id, now)
        return res
