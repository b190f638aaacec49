"""Booking in the ledger: the preview (read only) and the booking writer.

`BookingWriter.book` runs inside a unit of work (see `unit_of_work.py`) under the pool
lock (PostgreSQL advisory lock; SQLite has one writer): load the pool snapshot for the
window, run the placer, check quota, insert the reservation and its bookings, notice spot
victims and refresh the rollup's booked columns. The workflow around it replays and
records the idempotent answer in the same transaction. Each booking also writes its
claim rows on the physical devices (`device_claims`); on PostgreSQL exclusion
constraints over them (and over (atom, time range)) back the placer: if one ever fires,
the unit of work raises `WriteRaced` and the workflow retries on a fresh snapshot.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.domain.placement_model import Placement, PlacementRequest
from coordinator.domain.placer import place
from coordinator.domain.reservation import LIVE, BookedAtom, Reservation
from coordinator.domain.risk import UNHEALTHY, assess
from coordinator.ledger import quotas, schema
from coordinator.ledger.database import Database, lock_pool
from coordinator.ledger.device_claims import insert_claims, rows_for
from coordinator.ledger.quotas import TenantLocks
from coordinator.ledger.reservations import end_bookings, reservation_from_row
from coordinator.ledger.risk import at_risk_json
from coordinator.ledger.rollups import apply_booked_delta, refresh_booked
from coordinator.ledger.snapshot import HeldAtom, HeldScalar, SnapshotCache, bump
from shared.ids import new_reservation_id


@dataclass(frozen=True, slots=True)
class BookingRequest:
    tenant_id: str
    pool_id: str
    project_id: str | None
    placement: PlacementRequest
    start: int
    duration_ms: int
    lease_seconds: int | None
    resources: dict[str, int]
    gang: dict[str, Any] | None
    notice_ms: int


@dataclass(frozen=True, slots=True)
class Booked:
    reservation: Reservation
    victims: tuple[Reservation, ...]


@dataclass(frozen=True, slots=True)
class Preemptible:
    """A regular request that fits once spot reservations are noticed: how many would
    be, and when the request would start (after their notice)."""

    count: int
    starts_at: int


@dataclass(frozen=True, slots=True)
class NotPlaced:
    placement: Placement
    preemptible: Preemptible | None


@dataclass(frozen=True, slots=True)
class Preview:
    """Where a request would go now, and (a regular request that does not fit) what
    preempting spot reservations would give it."""

    placement: Placement
    preemptible: Preemptible | None


def booked_delta(
    atoms: list[HeldAtom], already_reserved: set[str], not_allocatable: set[str], now: int
) -> tuple[dict[str, int], dict[str, int]]:
    """What new atom bookings add to `allocated` (booked now) and `reserved` (starting
    later, each atom once however many later bookings it has). Atoms outside the
    allocatable bucket (a whole node's faulty devices) count in neither. Scalars are
    recounted instead: their `reserved` is a peak, not a sum."""
    allocated: dict[str, int] = {}
    reserved: dict[str, int] = {}
    for h in atoms:
        if h.atom_id in not_allocatable:
            continue
        if h.start <= now < h.end:
            allocated[h.cls] = allocated.get(h.cls, 0) + 1
        elif h.start > now and h.atom_id not in already_reserved:
            reserved[h.cls] = reserved.get(h.cls, 0) + 1
    return allocated, reserved


class BookingRepo:
    def __init__(self, db: Database, snapshots: SnapshotCache) -> None:
        self._db = db
        self._snapshots = snapshots

    async def preview(
        self, pool_id: str, req: PlacementRequest, start: int, end: int, now: int, notice_ms: int
    ) -> Preview:
        async with self._db.read() as conn:
            snap = await self._snapshots.snapshot(conn, pool_id, start, end, now)
            placement = place(req, snap)
            if placement.fits or req.spot:
                return Preview(placement, None)
            plan = await preempting(
                conn, self._snapshots, pool_id, req, start, end - start, now, notice_ms
            )
        if plan is None or not plan[0].fits:
            return Preview(placement, None)
        _, victims, moved_start = plan
        return Preview(placement, Preemptible(len(victims), moved_start))


async def preempting(
    conn: AsyncConnection,
    snapshots: SnapshotCache,
    pool_id: str,
    req: PlacementRequest,
    start: int,
    duration_ms: int,
    now: int,
    notice_ms: int,
) -> tuple[Placement, frozenset[str], int] | None:
    """For a regular request that does not fit: where it would go if it started at
    preemptAt and the spot reservations still holding what it takes were noticed.
    None when even preempting every spot booking would not make room."""
    first = place(
        req,
        await snapshots.snapshot(conn, pool_id, start, start + duration_ms, now),
        ignore_spot=True,
    )
    if not first.fits:
        return None
    moved_start = max(start, now + notice_ms)
    snap = await snapshots.snapshot(conn, pool_id, moved_start, moved_start + duration_ms, now)
    # Spot reservations that end before preemptAt need no notice.
    placement = place(req, snap)
    if placement.fits:
        return placement, frozenset(), moved_start
    placement = place(req, snap, ignore_spot=True)
    victims = frozenset().union(*(pick.victims for pick in placement.chosen))
    return placement, victims, moved_start


class BookingWriter:
    """Books inside a unit of work; the snapshot cache learns of new bookings only once
    the unit of work has committed (`after_commit`)."""

    def __init__(
        self,
        conn: AsyncConnection,
        snapshots: SnapshotCache,
        after_commit: Callable[[Callable[[], None]], None],
        tenant_locks: TenantLocks,
    ) -> None:
        self._conn = conn
        self._snapshots = snapshots
        self._after_commit = after_commit
        self._tenant_locks = tenant_locks

    async def book(self, r: BookingRequest, now: int) -> Booked | NotPlaced:
        """Place and book `r`, or say why it does not fit; raises QuotaExceeded."""
        conn = self._conn
        await lock_pool(conn, r.pool_id)
        start, end = r.start, r.start + r.duration_ms
        snap = await self._snapshots.snapshot(conn, r.pool_id, start, end, now)
        read_version = self._snapshots.bookings_version(r.pool_id)
        placement = place(r.placement, snap)
        victims: frozenset[str] = frozenset()
        preempt_at: int | None = None
        if not placement.fits and not r.placement.spot:
            plan = await preempting(
                conn, self._snapshots, r.pool_id, r.placement, start, r.duration_ms, now,
                r.notice_ms,
            )  # fmt: skip
            if plan is None or not plan[0].fits:
                return NotPlaced(placement, None)
            placement, victims, start = plan
            end, preempt_at = start + r.duration_ms, now + r.notice_ms
        elif not placement.fits:
            return NotPlaced(placement, None)
        await self._check_quota(conn, r, placement, start, end)
        reservation = reservation_of(r, placement, start, end, now)
        noticed = await self._notice(conn, sorted(victims), preempt_at, now) if victims else ()
        rows = BookingRows()
        rows.add(reservation, placement)
        await rows.write(conn)
        nodes = {n.node_id: n for n in snap.nodes}
        await insert_claims(
            conn,
            reservation.reservation_id,
            start,
            end,
            {p.node_id: rows_for(nodes[p.node_id], p.atoms) for p in placement.chosen},
        )
        await bump(conn, [r.pool_id], bookings=True)
        held_atoms, held_scalars = held_of(reservation, placement)
        if noticed:
            # Victims' bookings were cut short: recount, and let the cache reload.
            await refresh_booked(conn, r.pool_id, now)
        else:
            unhealthy = {a.atom_id for p in placement.chosen for a in p.atoms if not a.healthy}
            allocated, reserved = booked_delta(
                held_atoms, self._snapshots.reserved_atoms(r.pool_id, now), unhealthy, now
            )
            await apply_booked_delta(conn, r.pool_id, allocated, reserved, now)
            scalars = {sc.resource for sc in held_scalars}
            if scalars:
                await refresh_booked(conn, r.pool_id, now, scalars)
            version = read_version + 1
            self._after_commit(
                lambda: self._snapshots.committed(r.pool_id, version, held_atoms, held_scalars)
            )
        return Booked(reservation, noticed)

    async def _notice(
        self, conn: AsyncConnection, victims: list[str], preempt_at: int | None, now: int
    ) -> tuple[Reservation, ...]:
        assert preempt_at is not None
        rv = schema.reservations.c
        await conn.execute(
            update(schema.reservations)
            .where(rv.reservation_id.in_(victims) & rv.preempt_at.is_(None))
            .values(preempt_at=preempt_at, updated_at=now)
        )
        await end_bookings(conn, victims, preempt_at)
        rows = await conn.execute(select(schema.reservations).where(rv.reservation_id.in_(victims)))
        return tuple(reservation_from_row(row) for row in rows.all())

    async def _check_quota(
        self, conn: AsyncConnection, r: BookingRequest, placement: Placement, start: int, end: int
    ) -> None:
        asked = asked_of(placement)
        await quotas.check(conn, self._tenant_locks, r.tenant_id, r.pool_id, asked, start, end)


def reservation_of(
    r: BookingRequest, placement: Placement, start: int, end: int, now: int
) -> Reservation:
    """The reservation a fitting placement of `r` books over `[start, end)`."""
    # Only whole nodes are booked with their faulty devices: such a reservation is at
    # risk from its first answer, not from whichever node change re-judges it.
    unhealthy = {a.atom_id for p in placement.chosen for a in p.atoms if not a.healthy}
    return Reservation(
        reservation_id=new_reservation_id(),
        tenant_id=r.tenant_id,
        pool_id=r.pool_id,
        project_id=r.project_id,
        stored_state=LIVE,
        spot=r.placement.spot,
        binding=r.placement.binding,
        start=start,
        end=end,
        lease_seconds=r.lease_seconds,
        lease_expires_at=now + r.lease_seconds * 1000 if r.lease_seconds else None,
        preempt_at=None,
        resources=r.resources,
        gang=r.gang,
        atoms=tuple(
            BookedAtom(a.atom_id, pick.node_id, a.cls)
            for pick in placement.chosen
            for a in pick.atoms
        ),
        created_at=now,
        at_risk=assess(dict.fromkeys(unhealthy, UNHEALTHY), None, now),
    )


def asked_of(placement: Placement) -> dict[str, int]:
    """What a placement takes per atom class and scalar resource, for the quota check."""
    asked: dict[str, int] = {}
    for pick in placement.chosen:
        for a in pick.atoms:
            asked[a.cls] = asked.get(a.cls, 0) + 1
        for resource, amount in pick.resources:
            asked[resource] = asked.get(resource, 0) + amount
    return asked


def held_of(res: Reservation, placement: Placement) -> tuple[list[HeldAtom], list[HeldScalar]]:
    """The new reservation's bookings as the snapshot cache holds them."""
    atoms = [
        HeldAtom(a.atom_id, a.node_id, a.cls, res.reservation_id, res.spot, res.start, res.end)
        for a in res.atoms
    ]
    scalars = [
        HeldScalar(pick.node_id, resource, amount, res.reservation_id, res.spot, res.start, res.end)
        for pick in placement.chosen
        for resource, amount in pick.resources
        if amount > 0
    ]
    return atoms, scalars


class BookingRows:
    """The rows of one or more new reservations — the reservation, its atom and scalar
    bookings — written with one statement per table."""

    def __init__(self) -> None:
        self.reservations: list[dict[str, Any]] = []
        self.bookings: list[dict[str, Any]] = []
        self.scalars: list[dict[str, Any]] = []

    def add(self, res: Reservation, placement: Placement) -> None:
        self.reservations.append(
            {
                "reservation_id": res.reservation_id,
                "tenant_id": res.tenant_id,
                "pool_id": res.pool_id,
                "project_id": res.project_id,
                "state": LIVE,
                "spot": res.spot,
                "binding": res.binding,
                "start": res.start,
                "end": res.end,
                "lease_seconds": res.lease_seconds,
                "lease_expires_at": res.lease_expires_at,
                "preempt_at": None,
                "resources": res.resources,
                "gang": res.gang,
                "atoms": [
                    {"atomId": a.atom_id, "nodeId": a.node_id, "class": a.cls} for a in res.atoms
                ],
                "created_at": res.created_at,
                "updated_at": res.created_at,
                "at_risk": at_risk_json(res.at_risk),
            }
        )
        common = {
            "reservation_id": res.reservation_id,
            "tenant_id": res.tenant_id,
            "pool_id": res.pool_id,
            "spot": res.spot,
            "start": res.start,
            "end": res.end,
        }
        self.bookings += [
            common | {"node_id": a.node_id, "atom_id": a.atom_id, "class": a.cls} for a in res.atoms
        ]
        self.scalars += [
            common | {"node_id": pick.node_id, "resource": resource, "amount": amount}
            for pick in placement.chosen
            for resource, amount in pick.resources
            if amount > 0
        ]

    async def write(self, conn: AsyncConnection) -> None:
        if self.reservations:
            await conn.execute(schema.reservations.insert(), self.reservations)
        if self.bookings:
            await conn.execute(schema.bookings.insert(), self.bookings)
        if self.scalars:
            await conn.execute(schema.scalar_bookings.insert(), self.scalars)
