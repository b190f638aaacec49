"""Interval reservations in the ledger: per-quarter usage, the write (inside a unit of
work), the audit list and the calendar's numbers.

The writer runs under the pool lock (PostgreSQL advisory lock; SQLite has one writer),
and under the tenant's quota lock when a tenant-wide quota applies, so parallel writes
for the same interval (or the same tenant-wide limit) serialize; the loser sees the
winner's bookings and answers with the updated reservableGb. The tenant's usage against
its limit is the quota arithmetic of `quotas.py`: interval reservations and compute
`memoryGiB` bookings alike, at each quarter's busiest instant.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from sqlalchemy import and_, or_, select
from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.domain.commitments import Commitment, peaks, room
from coordinator.domain.intervals import (
    INTERVAL_MS,
    Interval,
    IntervalReservation,
    QuarterUsage,
)
from coordinator.domain.model import Quota
from coordinator.ledger import quotas, schema
from coordinator.ledger.database import Database
from coordinator.ledger.quotas import TenantLocks
from coordinator.ledger.risk import at_risk_from_json
from coordinator.ledger.rollups import refresh_booked
from coordinator.ledger.snapshot import bump

RESOURCE = "memoryGiB"


async def usage(
    conn: AsyncConnection,
    tenant_id: str,
    pool_id: str,
    quarters: Sequence[int],
    locks: TenantLocks | None = None,
) -> dict[int, QuarterUsage]:
    """For each quarter start: the limit shown and what the tenant uses against it, the
    pool's free memory after every booking (interval ones and node-level memory of
    compute ones) and the room the tightest quota leaves — all at the quarter's busiest
    instant. Inside a unit of work `locks` says whether the tenant's quota lock is held."""
    if not quarters:
        return {}
    lo, hi = min(quarters), max(quarters) + INTERVAL_MS
    windows = [(q, q + INTERVAL_MS) for q in quarters]
    r, s = schema.rollup.c, schema.scalar_bookings.c
    allocatable = (
        await conn.execute(
            select(r.allocatable).where((r.pool_id == pool_id) & (r.resource == RESOURCE))
        )
    ).scalar_one_or_none() or 0
    pool_rows = await conn.execute(
        select(s.start, s.end, s.amount).where(
            (s.pool_id == pool_id) & (s.resource == RESOURCE) & (s.start < hi) & (s.end > lo)
        )
    )
    pool_used = peaks([Commitment(int(a), int(b), int(n)) for a, b, n in pool_rows], windows)
    limits = await quotas.applicable(conn, tenant_id, pool_id, [RESOURCE]) or [
        Quota(tenant_id, pool_id, RESOURCE, int(allocatable))
    ]
    used_by_limit = []
    for quota in limits:
        if quota.pool_id is None and locks is not None:
            await locks.ensure(tenant_id)
        held = await quotas.commitments(conn, tenant_id, RESOURCE, quota.pool_id, lo, hi)
        used_by_limit.append(peaks(held, windows))
    shown, shown_used = limits[0], used_by_limit[0]
    rooms = [
        min(room(q.limit, used[i]) for q, used in zip(limits, used_by_limit, strict=True))
        for i in range(len(quarters))
    ]
    return {
        quarter: QuarterUsage(
            limit_gb=shown.limit,
            tenant_gb=shown_used[i],
            pool_free_gb=max(0, int(allocatable) - pool_used[i]),
            room_gb=rooms[i],
        )
        for i, quarter in enumerate(quarters)
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
                    at_risk_from_json(row.at_risk),
                )
                for row in rows.all()
            ]


class IntervalWriter:
    """Interval bookings inside a unit of work (which holds the pool lock)."""

    def __init__(self, conn: AsyncConnection, tenant_locks: TenantLocks) -> None:
        self._conn = conn
        self._tenant_locks = tenant_locks

    async def usage(
        self, tenant_id: str, pool_id: str, quarters: Sequence[int]
    ) -> dict[int, QuarterUsage]:
        return await usage(self._conn, tenant_id, pool_id, quarters, self._tenant_locks)

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
