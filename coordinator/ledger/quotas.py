"""Quotas per tenant, pool (or every pool) and resource: set by operators, checked by
every writer with one arithmetic.

What a tenant uses against a quota is read by one query (`commitments`: its bookings
of a resource in one pool or in every pool, over a window) and counted by the domain's
peak arithmetic (`coordinator/domain/commitments.py`); compute creates and interval
reservations both go through it. A tenant-wide quota spans pools whose writers hold
different pool locks, so its check is serialized by the tenant's quota lock, taken
before any pool lock (one lock order: tenant, then pools sorted, then reservations).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import Select, bindparam, delete, select
from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.domain.booking import OverQuota
from coordinator.domain.commitments import Commitment
from coordinator.domain.errors import QuotaExceeded
from coordinator.domain.model import SCALAR_RESOURCES, Quota
from coordinator.ledger import schema
from coordinator.ledger.database import Database

EVERY_POOL = ""  # the pool_id column of a tenant-wide quota
# A key space of its own for advisory locks on tenants (pool locks use the one-key form,
# whose space PostgreSQL keeps apart from the two-key form).
_TENANT_LOCK_SPACE = 1


def _tenant_wide_select() -> Select[Any]:
    q = schema.quotas.c
    return (
        select(q.tenant_id)
        .where(q.tenant_id.in_(bindparam("w_tenants", expanding=True)))
        .where(q.pool_id == EVERY_POOL)
        .distinct()
    )


def _of_tenants_select() -> Select[Any]:
    q = schema.quotas.c
    return select(q.tenant_id, q.pool_id, q.resource, q.limit).where(
        q.tenant_id.in_(bindparam("w_tenants", expanding=True))
        & q.pool_id.in_(bindparam("w_pools", expanding=True))
    )


# Built once: every batch of creates runs both (building a statement and its cache key
# again for each cost about what running it did).
_TENANT_WIDE = _tenant_wide_select()
_OF_TENANTS = _of_tenants_select()


class QuotaLockMissed(Exception):
    """A tenant-wide quota appeared after the unit of work chose not to take the
    tenant's lock; the work must start again (it then takes it first)."""


class TenantLocks:
    """The tenant quota locks one unit of work holds."""

    def __init__(self, conn: AsyncConnection) -> None:
        self._conn = conn
        self._held: set[str] = set()

    async def take(self, tenant_id: str) -> None:
        """Take the tenant's quota lock if it has a tenant-wide quota. Call before any
        pool lock."""
        # SQLite admits one writer at a time (`BEGIN IMMEDIATE`): nothing to take, and
        # `ensure` never asks.
        if self._conn.dialect.name != "postgresql":
            return
        if tenant_id in self._held or not await _has_tenant_wide(self._conn, tenant_id):
            return
        await self._conn.exec_driver_sql(
            f"SELECT pg_advisory_xact_lock({_TENANT_LOCK_SPACE}, hashtext($1))", (tenant_id,)
        )
        self._held.add(tenant_id)

    async def take_all(self, tenant_ids: Iterable[str]) -> None:
        """`take` for several tenants (a batch of creates): which of them have a
        tenant-wide quota is one query, and their locks are taken in sorted order."""
        if self._conn.dialect.name != "postgresql":
            return
        wanted = sorted(set(tenant_ids) - self._held)
        if not wanted:
            return
        rows = await self._conn.execute(_TENANT_WIDE, {"w_tenants": wanted})
        for tenant_id in sorted(row[0] for row in rows.all()):
            await self._conn.exec_driver_sql(
                f"SELECT pg_advisory_xact_lock({_TENANT_LOCK_SPACE}, hashtext($1))", (tenant_id,)
            )
            self._held.add(tenant_id)

    async def ensure(self, tenant_id: str) -> None:
        """Before counting against a tenant-wide quota: the lock must be held. Taking it
        now could wait behind a writer that waits for our pool lock, so only an
        uncontended lock is taken; otherwise the work starts over."""
        if tenant_id in self._held or self._conn.dialect.name != "postgresql":
            return
        got = (
            await self._conn.exec_driver_sql(
                f"SELECT pg_try_advisory_xact_lock({_TENANT_LOCK_SPACE}, hashtext($1))",
                (tenant_id,),
            )
        ).scalar_one()
        if not got:
            raise QuotaLockMissed(tenant_id)
        self._held.add(tenant_id)


async def _has_tenant_wide(conn: AsyncConnection, tenant_id: str) -> bool:
    q = schema.quotas.c
    row = await conn.execute(
        select(q.resource).where((q.tenant_id == tenant_id) & (q.pool_id == EVERY_POOL)).limit(1)
    )
    return row.first() is not None


async def applicable(
    conn: AsyncConnection, tenant_id: str, pool_id: str, resources: Iterable[str]
) -> list[Quota]:
    """The quotas a booking of `resources` in `pool_id` must stay within: the pool's own
    and the tenant-wide ones (`pool_id` None), most specific first."""
    wanted = sorted(set(resources))
    if not wanted:
        return []
    q = schema.quotas.c
    rows = await conn.execute(
        select(q.pool_id, q.resource, q.limit).where(
            (q.tenant_id == tenant_id)
            & q.pool_id.in_([EVERY_POOL, pool_id])
            & q.resource.in_(wanted)
        )
    )
    found = [Quota(tenant_id, row[0] or None, row[1], int(row[2])) for row in rows.all()]
    return sorted(found, key=lambda qu: (qu.resource, qu.pool_id is None))


async def commitments(
    conn: AsyncConnection, tenant_id: str, resource: str, pool_id: str | None, start: int, end: int
) -> list[Commitment]:
    """The tenant's bookings of `resource` overlapping `[start, end)`, in one pool or
    (None) in every pool: scalar amounts as booked (interval reservations included),
    one per atom for atom classes."""
    if resource in SCALAR_RESOURCES:
        s = schema.scalar_bookings.c
        cond = (s.tenant_id == tenant_id) & (s.resource == resource)
        cond &= (s.start < end) & (s.end > start)
        if pool_id is not None:
            cond &= s.pool_id == pool_id
        rows = await conn.execute(select(s.start, s.end, s.amount).where(cond))
        return [Commitment(int(a), int(b), int(n)) for a, b, n in rows.all()]
    b = schema.bookings.c
    cond = (b.tenant_id == tenant_id) & (b["class"] == resource)
    cond &= (b.start < end) & (b.end > start)
    if pool_id is not None:
        cond &= b.pool_id == pool_id
    atom_rows = await conn.execute(select(b.start, b.end).where(cond))
    return [Commitment(int(a), int(e), 1) for a, e in atom_rows.all()]


async def of_tenants(conn: AsyncConnection, tenant_ids: Iterable[str], pool_id: str) -> list[Quota]:
    """Every quota of these tenants that bookings in `pool_id` count against."""
    rows = await conn.execute(
        _OF_TENANTS, {"w_tenants": sorted(set(tenant_ids)), "w_pools": [EVERY_POOL, pool_id]}
    )
    found = [Quota(row[0], row[1] or None, row[2], int(row[3])) for row in rows.all()]
    return sorted(found, key=lambda qu: (qu.tenant_id, qu.resource, qu.pool_id is None))


def exceeded(verdict: OverQuota) -> QuotaExceeded:
    """The QUOTA_EXCEEDED error of a quota verdict (`domain.booking.quota_verdict`)."""
    quota, used, want = verdict.quota, verdict.used, verdict.requested
    return QuotaExceeded(
        f"quota for {quota.resource} exceeded: {used} in use at the busiest instant "
        f"of the window, {want} asked, limit {quota.limit}",
        {
            "resource": quota.resource,
            "poolId": quota.pool_id,
            "limit": quota.limit,
            "used": used,
            "requested": want,
        },
    )


class QuotaRepo:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def set(self, quota: Quota, now: int) -> None:
        q = schema.quotas.c
        key = (
            (q.tenant_id == quota.tenant_id)
            & (q.pool_id == (quota.pool_id or EVERY_POOL))
            & (q.resource == quota.resource)
        )
        async with self._db.transaction() as conn:
            await conn.execute(delete(schema.quotas).where(key))
            await conn.execute(
                schema.quotas.insert().values(
                    tenant_id=quota.tenant_id,
                    pool_id=quota.pool_id or EVERY_POOL,
                    resource=quota.resource,
                    limit=quota.limit,
                    updated_at=now,
                )
            )

    async def for_tenant(self, tenant_id: str) -> list[Quota]:
        q = schema.quotas.c
        async with self._db.read() as conn:
            rows = await conn.execute(
                select(schema.quotas)
                .where(q.tenant_id == tenant_id)
                .order_by(q.pool_id, q.resource)
            )
            return [Quota(r.tenant_id, r.pool_id or None, r.resource, r.limit) for r in rows.all()]
