"""Interval reservations in the ledger: per-quarter usage, the atomic write, the audit
list and the calendar's numbers.

A write locks the pool (PostgreSQL advisory lock; SQLite has one writer), so parallel
writes for the same interval serialize; the loser sees the winner's bookings and answers
with the updated reservableGb.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, or_, select
from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.domain.intervals import INTERVAL_MS, Interval, format_time, reservable_gb
from coordinator.ledger import idempotency, schema
from coordinator.ledger.database import Database, lock_pool
from coordinator.ledger.rollups import refresh_booked
from coordinator.ledger.snapshot import bump

ENDPOINT = "capacity.reservations"
RESOURCE = "memoryGiB"


@dataclass(frozen=True, slots=True)
class QuarterUsage:
    limit_gb: int
    tenant_gb: int
    pool_free_gb: int

    @property
    def reservable(self) -> int:
        return reservable_gb(self.limit_gb, self.tenant_gb, self.pool_free_gb)


@dataclass(frozen=True, slots=True)
class IntervalReservation:
    reservation_id: str
    tenant_id: str
    pool_id: str
    created_at: int
    intervals: tuple[Interval, ...]

    def to_api(self) -> dict[str, Any]:
        return {
            "reservationId": self.reservation_id,
            "createdAt": format_time(self.created_at),
            "intervals": [iv.to_api() for iv in self.intervals],
        }


@dataclass(frozen=True, slots=True)
class Refused:
    failures: tuple[dict[str, Any], ...]


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

    async def create(
        self,
        tenant_id: str,
        pool_id: str,
        intervals: Sequence[Interval],
        seen_before: dict[int, QuarterUsage],
        key: str | None,
        digest: str,
        now: int,
    ) -> IntervalReservation | Refused | idempotency.Recorded:
        """All intervals or none. `seen_before` is what the request saw before taking the
        lock: an interval that fitted then but not now lost a race (`concurrent_write`)."""
        async with self._db.transaction() as conn:
            await lock_pool(conn, pool_id)
            if key is not None:
                found = await idempotency.lookup(conn, tenant_id, ENDPOINT, key, digest)
                if found is not None:
                    return found
            current = await usage(conn, tenant_id, pool_id, [iv.starts_at for iv in intervals])
            failures = []
            for iv in intervals:
                now_free = current[iv.starts_at].reservable
                if iv.capacity_gb <= now_free:
                    continue
                before = seen_before.get(iv.starts_at)
                raced = before is not None and iv.capacity_gb <= before.reservable
                failures.append(
                    {
                        "startsAt": format_time(iv.starts_at),
                        "requestedGb": iv.capacity_gb,
                        "reservableGb": now_free,
                        "reason": "concurrent_write" if raced else "insufficient_capacity",
                    }
                )
            if failures:
                return Refused(tuple(failures))
            res = IntervalReservation(str(uuid.uuid4()), tenant_id, pool_id, now, tuple(intervals))
            await conn.execute(
                schema.interval_reservations.insert().values(
                    reservation_id=res.reservation_id,
                    tenant_id=tenant_id,
                    pool_id=pool_id,
                    created_at=now,
                    intervals=[
                        {
                            "startsAt": iv.starts_at,
                            "endsAt": iv.ends_at,
                            "capacityGb": iv.capacity_gb,
                        }
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
            if key is not None:
                await idempotency.store(
                    conn, tenant_id, ENDPOINT, key, digest, 200, res.to_api(), now
                )
        return res

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
