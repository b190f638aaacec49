"""Booked spans for usage accounting: every atom and scalar booking that overlaps a
window, with the tenant, pool and project it was booked for, and the cut its
reservation's preemption or lease expiry puts on it (read only).

Interval reservations (seed 002) book pool memory in `scalar_bookings` without a row in
`reservations`; they are counted too, with no project.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, select

from coordinator.domain.booked_hours import UsageSpan
from coordinator.ledger import schema
from coordinator.ledger.database import Database


def _cut(row: Any) -> int | None:
    """The earliest of preemptAt and the lease's expiry that falls before the end."""
    cuts = [t for t in (row.preempt_at, row.lease_expires_at) if t is not None and t < row.r_end]
    return min(cuts) if cuts else None


class BookedSpanRepo:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def spans(
        self,
        start: int,
        end: int,
        tenant_id: str | None = None,
        pool_id: str | None = None,
        project_id: str | None = None,
    ) -> list[UsageSpan]:
        rv = schema.reservations.c
        out: list[UsageSpan] = []
        async with self._db.read() as conn:
            for table, amount in (
                (schema.bookings, None),
                (schema.scalar_bookings, schema.scalar_bookings.c.amount),
            ):
                c = table.c
                cond: ColumnElement[bool] = (c.start < end) & (c.end > start) & (c.end > c.start)
                if tenant_id is not None:
                    cond &= c.tenant_id == tenant_id
                if pool_id is not None:
                    cond &= c.pool_id == pool_id
                if project_id is not None:
                    cond &= rv.project_id == project_id
                resource = c["class"] if amount is None else c.resource
                query = (
                    select(
                        c.reservation_id, c.tenant_id, c.pool_id, c.start, c.end,
                        resource.label("resource"),
                        (amount if amount is not None else c.start * 0 + 1).label("amount"),
                        rv.project_id, rv.preempt_at, rv.lease_expires_at,
                        rv.end.label("r_end"),
                    )
                    .select_from(
                        table.outerjoin(
                            schema.reservations, rv.reservation_id == c.reservation_id
                        )
                    )
                    .where(cond)
                )  # fmt: skip
                for row in (await conn.execute(query)).all():
                    out.append(
                        UsageSpan(
                            tenant_id=row.tenant_id,
                            pool_id=row.pool_id,
                            project_id=row.project_id,
                            resource=row.resource,
                            amount=int(row.amount),
                            start=int(row.start),
                            end=int(row.end),
                            reservation_id=row.reservation_id,
                            cut=_cut(row) if row.r_end is not None else None,
                        )
                    )
        return out
