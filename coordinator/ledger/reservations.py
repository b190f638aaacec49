"""Reservations after booking: reads, what the clock decides (lease expiry, preemption,
bookings starting and ending), and the release/renew writer a unit of work holds."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from sqlalchemy import Row, delete, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.domain.errors import NotFound
from coordinator.domain.reservation import LIVE, BookedAtom, Reservation
from coordinator.domain.timeline import BookedSpan
from coordinator.ledger import schema
from coordinator.ledger.database import Database, lock_pool
from coordinator.ledger.risk import at_risk_from_json
from coordinator.ledger.rollups import refresh_booked
from coordinator.ledger.snapshot import bump


def reservation_from_row(row: Row[Any]) -> Reservation:
    return Reservation(
        reservation_id=row.reservation_id,
        tenant_id=row.tenant_id,
        pool_id=row.pool_id,
        project_id=row.project_id,
        stored_state=row.state,
        spot=bool(row.spot),
        binding=row.binding,
        start=row.start,
        end=row.end,
        lease_seconds=row.lease_seconds,
        lease_expires_at=row.lease_expires_at,
        preempt_at=row.preempt_at,
        resources=dict(row.resources or {}),
        gang=row.gang,
        atoms=tuple(BookedAtom(a["atomId"], a["nodeId"], a["class"]) for a in row.atoms),
        created_at=row.created_at,
        ended_at=row.ended_at,
        at_risk=at_risk_from_json(row.at_risk),
    )


async def end_bookings(conn: AsyncConnection, reservation_ids: list[str], at: int) -> None:
    """End the reservations' bookings (and their device claims) at `at`: bookings not
    started by then are deleted (a zero-length booking would still count in quotas,
    timelines and `reserved`), the others cut short. The reservation row keeps the atoms it held."""
    for table in (schema.bookings, schema.scalar_bookings, schema.device_claims):
        c = table.c
        await conn.execute(
            delete(table).where(c.reservation_id.in_(reservation_ids) & (c.start >= at))
        )
        await conn.execute(
            update(table).where(c.reservation_id.in_(reservation_ids) & (c.end > at)).values(end=at)
        )


async def owned(
    conn: AsyncConnection, reservation_id: str, tenant_id: str | None, *,
    for_update: bool = False,
) -> Reservation:  # fmt: skip
    """The tenant's reservation; another tenant's is as absent as a missing one (tenant
    None: any tenant's). With `for_update` the row stays locked until the transaction
    ends (the last lock in the lock order: tenant, pools, reservations)."""
    rv = schema.reservations.c
    where = rv.reservation_id == reservation_id
    if tenant_id is not None:
        where &= rv.tenant_id == tenant_id
    query = select(schema.reservations).where(where)
    if for_update:
        query = query.with_for_update()
    row = (await conn.execute(query)).first()
    if row is None:
        raise NotFound(f"reservation {reservation_id} not found")
    return reservation_from_row(row)


class ReservationRepo:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def get(self, reservation_id: str, tenant_id: str | None) -> Reservation:
        """The tenant's reservation (None: whichever tenant's, for an operator)."""
        async with self._db.read() as conn:
            return await owned(conn, reservation_id, tenant_id)

    async def expire_and_preempt(self, now: int) -> list[Reservation]:
        """Persist what the clock decided: leases that ran out free their atoms, noticed
        spot reservations become preempted. Returns the reservations that ended.

        The pools are locked first (sorted), as every booking writer does, so this
        never deadlocks with a create or a release on PostgreSQL."""
        rv = schema.reservations.c
        due_preempt = (
            (rv.state == LIVE) & rv.preempt_at.is_not(None) & (rv.preempt_at <= now)
            & (rv.end > rv.preempt_at)
        )  # fmt: skip
        due_expiry = (
            (rv.state == LIVE) & rv.lease_expires_at.is_not(None)
            & (rv.lease_expires_at <= now) & (rv.end > now)
        )  # fmt: skip
        async with self._db.read() as conn:
            pools = (
                await conn.execute(
                    select(rv.pool_id).distinct().where(due_preempt | due_expiry)
                )
            ).scalars().all()  # fmt: skip
        if not pools:
            return []
        ended: list[Reservation] = []
        async with self._db.transaction() as conn:
            for pool_id in sorted(pools):
                await lock_pool(conn, pool_id)
            in_pools = rv.pool_id.in_(pools)
            preempted = (
                await conn.execute(select(schema.reservations).where(in_pools & due_preempt))
            ).all()
            taken = {row.reservation_id for row in preempted}
            expired = [
                row
                for row in (
                    await conn.execute(select(schema.reservations).where(in_pools & due_expiry))
                ).all()
                if row.reservation_id not in taken
            ]
            touched: set[str] = set()
            for rows, state in ((preempted, "preempted"), (expired, "expired")):
                ids = [row.reservation_id for row in rows]
                if not ids:
                    continue
                await conn.execute(
                    update(schema.reservations)
                    .where(rv.reservation_id.in_(ids) & (rv.state == LIVE))
                    .values(state=state, ended_at=now, updated_at=now)
                )
                await end_bookings(conn, ids, now)
                for row in rows:
                    touched.add(row.pool_id)
                    ended.append(
                        replace(reservation_from_row(row), stored_state=state, ended_at=now)
                    )
            await bump(conn, touched, bookings=True)
            for pool_id in sorted(touched):
                await refresh_booked(conn, pool_id, now)
        return ended

    async def pools_with_boundaries(self, after: int, upto: int) -> list[str]:
        """Pools where a booking started or ended in (after, upto]: their booked columns
        moved with the clock alone."""
        b = schema.bookings.c
        s = schema.scalar_bookings.c
        found: set[str] = set()
        async with self._db.read() as conn:
            for c in (b, s):
                rows = await conn.execute(
                    select(c.pool_id)
                    .distinct()
                    .where(
                        ((c.start > after) & (c.start <= upto))
                        | ((c.end > after) & (c.end <= upto))
                    )
                )
                found.update(rows.scalars().all())
        return sorted(found)

    async def refresh_pools(self, pool_ids: Iterable[str], now: int) -> None:
        for pool_id in pool_ids:
            async with self._db.transaction() as conn:
                await lock_pool(conn, pool_id)
                await refresh_booked(conn, pool_id, now)

    async def booked_gpus(self, pool_id: str, start: int, end: int) -> list[BookedSpan]:
        """Whole-GPU bookings overlapping [start, end) (MIG and slot atoms not counted)."""
        b = schema.bookings.c
        async with self._db.read() as conn:
            rows = await conn.execute(
                select(b.atom_id, b.start, b.end).where(
                    (b.pool_id == pool_id)
                    & (b["class"] == "gpu")
                    & (b.start < end)
                    & (b.end > start)
                )
            )
            return [BookedSpan(a, int(s_), int(e)) for a, s_, e in rows.all()]


class ReservationWriter:
    """Release and renew, inside a unit of work. Each takes the reservation's pool lock
    and reads the row again under it, as the clock and a preempting create do, so the
    four are serialized: none acts on a state another has already changed."""

    def __init__(self, conn: AsyncConnection) -> None:
        self._conn = conn

    async def release(self, reservation_id: str, tenant_id: str, now: int) -> Reservation:
        """End a live reservation now; the rest of its time is free at once."""
        rv = schema.reservations.c
        conn = self._conn
        res = await owned(conn, reservation_id, tenant_id)
        await lock_pool(conn, res.pool_id)
        # Read again under the lock: the clock may have ended it meanwhile.
        res = await owned(conn, reservation_id, tenant_id, for_update=True)
        if not res.live(now):
            return res
        await conn.execute(
            update(schema.reservations)
            .where((rv.reservation_id == reservation_id) & (rv.state == LIVE))
            .values(state="released", ended_at=now, updated_at=now)
        )
        await end_bookings(conn, [reservation_id], now)
        await bump(conn, [res.pool_id], bookings=True)
        await refresh_booked(conn, res.pool_id, now)
        return replace(res, stored_state="released", ended_at=now)

    async def renew(
        self, reservation_id: str, tenant_id: str, lease_seconds: int | None, now: int
    ) -> Reservation | None:
        """Extend the lease from now; None when the reservation has no lease or is over.

        Under the pool lock, like the clock that expires leases: an "extended" answer is
        never given for a lease the clock has already ended (and its atoms freed)."""
        rv = schema.reservations.c
        conn = self._conn
        res = await owned(conn, reservation_id, tenant_id)
        await lock_pool(conn, res.pool_id)
        res = await owned(conn, reservation_id, tenant_id, for_update=True)
        if res.lease_seconds is None or not res.live(now):
            return None
        seconds = lease_seconds or res.lease_seconds
        expires = now + seconds * 1000
        done = await conn.execute(
            update(schema.reservations)
            .where((rv.reservation_id == reservation_id) & (rv.state == LIVE))
            .values(lease_seconds=seconds, lease_expires_at=expires, updated_at=now)
        )
        if done.rowcount != 1:
            return None
        return replace(res, lease_seconds=seconds, lease_expires_at=expires)
