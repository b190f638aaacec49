"""Reservations as listings see them: a page, newest first, filtered by tenant (or every
tenant, for an operator), pool, project, node, state at `now` and a time window.

Only terminal states are stored; scheduled, active, noticed and completed (and a
preemption or lease expiry the clock has not persisted yet) are derived from the clock
the same way `Reservation.state` derives them, here as SQL, so a filtered page is full.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from sqlalchemy import ColumnElement, and_, case, false, func, or_, select

from coordinator.domain.reservation import LIVE, Reservation
from coordinator.ledger import schema
from coordinator.ledger.database import Database
from coordinator.ledger.reservations import reservation_from_row
from shared.reservation_states import ReservationState


@dataclass(frozen=True, slots=True)
class ReservationFilter:
    tenant_id: str | None = None  # None: every tenant
    pool_id: str | None = None
    project_id: str | None = None
    node_id: str | None = None  # only those with a booking on this node
    states: Collection[ReservationState] = ()  # empty: every state
    start: int | None = None  # overlapping [start, end) of the window
    end: int | None = None


def state_condition(state: ReservationState, now: int) -> ColumnElement[bool]:
    rv = schema.reservations.c
    live = rv.state == LIVE
    noticed = rv.preempt_at.is_not(None) & (rv.preempt_at < rv.end)
    leased = rv.lease_expires_at.is_not(None) & (rv.lease_expires_at < rv.end)
    lapsed = leased & (rv.lease_expires_at <= now)
    plain = live & ~noticed & ~lapsed
    if state == "noticed":
        return live & noticed & (rv.preempt_at > now)
    if state == "preempted":
        return (rv.state == "preempted") | (live & noticed & (rv.preempt_at <= now))
    if state == "expired":
        return (rv.state == "expired") | (live & ~noticed & lapsed)
    if state == "released":
        return rv.state == "released"
    if state == "scheduled":
        return plain & (rv.start > now)
    if state == "active":
        return plain & (rv.start <= now) & (rv.end > now)
    if state == "completed":
        return plain & (rv.end <= now)
    raise ValueError(f"unknown state {state!r}")


class ReservationListing:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def page(
        self, f: ReservationFilter, before: tuple[int, str] | None, limit: int, now: int
    ) -> list[Reservation]:
        """Newest first; `before` is the (createdAt, reservationId) of the last one seen."""
        rv = schema.reservations.c
        cond: ColumnElement[bool] = rv.reservation_id.is_not(None)
        if f.tenant_id is not None:
            cond &= rv.tenant_id == f.tenant_id
        if f.pool_id:
            cond &= rv.pool_id == f.pool_id
        if f.project_id:
            cond &= rv.project_id == f.project_id
        if f.node_id:
            b = schema.bookings.c
            cond &= rv.reservation_id.in_(
                select(b.reservation_id).where(b.node_id == f.node_id).distinct()
            )
        if f.states:
            cond &= or_(false(), *(state_condition(s, now) for s in sorted(set(f.states))))
        if f.end is not None:
            cond &= rv.start < f.end
        if f.start is not None:
            # Its end as it ran: ended, or cut by a preemption the clock has not persisted.
            cut = case((rv.preempt_at < rv.end, rv.preempt_at), else_=rv.end)
            cond &= func.coalesce(rv.ended_at, cut) > f.start
        if before is not None:
            created, rid = before
            cond &= or_(
                rv.created_at < created, and_(rv.created_at == created, rv.reservation_id < rid)
            )
        async with self._db.read() as conn:
            rows = await conn.execute(
                select(schema.reservations)
                .where(cond)
                .order_by(rv.created_at.desc(), rv.reservation_id.desc())
                .limit(limit)
            )
            return [reservation_from_row(row) for row in rows.all()]
