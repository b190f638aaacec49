"""Chargeback's reads and the use pass's memory write (SPEC §13): memory held per
quarter, tenant and pool (`memory_use`, added to in place; peaks take the larger), and
the interval reservations of the same quarters (`scalar_bookings` rows of interval
reservations: one quarter each)."""

from __future__ import annotations

from collections.abc import Mapping

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.domain.consumption import MemoryAccrued, MemoryKey
from coordinator.ledger import schema
from coordinator.ledger.database import Database

RESOURCE = "memoryGiB"


class MemoryUseRepo:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def used(
        self, start: int, end: int, tenant_id: str | None = None, pool_id: str | None = None
    ) -> dict[MemoryKey, MemoryAccrued]:
        """The memory held in the quarters of [start, end), of this tenant and pool where
        given (a tenant's own rows never include unattributed use)."""
        m = schema.memory_use.c
        cond: ColumnElement[bool] = (m.quarter >= start) & (m.quarter < end)
        if tenant_id is not None:
            cond &= m.tenant_id == tenant_id
        if pool_id is not None:
            cond &= m.pool_id == pool_id
        async with self._db.read() as conn:
            rows = await conn.execute(
                select(m.quarter, m.tenant_id, m.pool_id, m.mib_ms, m.peak_mib).where(cond)
            )
            return {
                MemoryKey(int(r.quarter), r.tenant_id, r.pool_id): MemoryAccrued(
                    int(r.mib_ms), int(r.peak_mib)
                )
                for r in rows.all()
            }

    async def reserved(
        self, start: int, end: int, tenant_id: str | None = None, pool_id: str | None = None
    ) -> dict[MemoryKey, int]:
        """GB reserved by interval reservations per quarter of [start, end), tenant and
        pool (summed: a tenant may hold several reservations of one quarter)."""
        s, iv = schema.scalar_bookings.c, schema.interval_reservations.c
        cond = interval_booked(start, end, tenant_id, pool_id)
        async with self._db.read() as conn:
            rows = await conn.execute(
                select(s.start, s.tenant_id, s.pool_id, func.sum(s.amount).label("gb"))
                .select_from(
                    schema.scalar_bookings.join(
                        schema.interval_reservations, iv.reservation_id == s.reservation_id
                    )
                )
                .where(cond)
                .group_by(s.start, s.tenant_id, s.pool_id)
            )
            return {MemoryKey(int(r.start), r.tenant_id, r.pool_id): int(r.gb) for r in rows.all()}


def interval_booked(
    start: int, end: int, tenant_id: str | None, pool_id: str | None
) -> ColumnElement[bool]:
    """The `scalar_bookings` rows of interval reservations (pool-level memory) starting
    in [start, end), of this tenant and pool where given."""
    s = schema.scalar_bookings.c
    cond: ColumnElement[bool] = (
        (s.resource == RESOURCE) & (s.node_id == "") & (s.start >= start) & (s.start < end)
    )
    if tenant_id is not None:
        cond &= s.tenant_id == tenant_id
    if pool_id is not None:
        cond &= s.pool_id == pool_id
    return cond


async def add_memory(conn: AsyncConnection, accrued: Mapping[MemoryKey, MemoryAccrued]) -> None:
    """Add a pass's (or a flush's) memory to the quarters it touched, in one statement."""
    if not accrued:
        return
    rows = [
        {
            "quarter": k.quarter, "tenant_id": k.tenant_id, "pool_id": k.pool_id,
            "mib_ms": v.mib_ms, "peak_mib": v.peak_mib,
        }
        for k, v in sorted(accrued.items())  # one order for every writer: no crosswise waits
    ]  # fmt: skip
    pg = conn.dialect.name == "postgresql"
    stmt = (postgresql if pg else sqlite).insert(schema.memory_use)
    larger = func.greatest if pg else func.max  # SQLite's two-argument max() is scalar
    stmt = stmt.on_conflict_do_update(
        index_elements=["quarter", "tenant_id", "pool_id"],
        set_={
            "mib_ms": schema.memory_use.c.mib_ms + stmt.excluded.mib_ms,
            "peak_mib": larger(schema.memory_use.c.peak_mib, stmt.excluded.peak_mib),
        },
    )
    await conn.execute(stmt, rows)
