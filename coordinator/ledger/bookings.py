"""Booking in the ledger: load a draft, write a decision (`coordinator/domain/booking.py`
decides), and the read-only preview.

`BookingWriter.book` runs inside a unit of work (see `unit_of_work.py`) under the pool
lock (PostgreSQL advisory lock; SQLite has one writer): load the `Draft` (the pool for
any window, the tenant's quotas and what counts against them), let `decide` answer, and
write its `Decision` — notice spot victims, insert the reservation, its bookings and
claim rows, refresh the rollup's booked columns. The batched path (`booking_batch`)
loads one draft for many requests and writes their decisions together with the same
`write_decisions`. Each booking's claim rows on the physical devices (`device_claims`)
back the placer on PostgreSQL with exclusion constraints: if one ever fires, the unit
of work raises `WriteRaced` and the workflow retries on a fresh snapshot.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.domain.booking import (
    LOCKED_OUT,
    Booked,
    BookingRequest,
    Decision,
    Deferred,
    Draft,
    NotPlaced,
    OverQuota,
    PoolWindows,
    Preview,
    decide,
    preview,
)
from coordinator.domain.commitments import Commitment
from coordinator.domain.node_fit import BusyUnits, busy_allocatable
from coordinator.domain.placement_model import PlacementRequest
from coordinator.domain.reservation import LIVE, Reservation
from coordinator.ledger import quotas, schema
from coordinator.ledger.bulk import insert_many
from coordinator.ledger.database import Database, lock_pool
from coordinator.ledger.device_claims import claim_values, write_claims
from coordinator.ledger.quotas import QuotaLockMissed, TenantLocks
from coordinator.ledger.reservations import end_bookings, reservation_from_row
from coordinator.ledger.risk import at_risk_json
from coordinator.ledger.rollups import apply_booked_delta, refresh_booked
from coordinator.ledger.snapshot import PoolView, SnapshotCache, bump
from coordinator.ledger.version_peek import VersionPeek

# Bookings end before this; commitments are read from `now` to here.
_FOREVER = 2**62


class BookingRepo:
    def __init__(self, db: Database, snapshots: SnapshotCache, peek: VersionPeek) -> None:
        self._db = db
        self._snapshots = snapshots
        self._peek = peek

    async def preview(
        self,
        pool_id: str,
        req: PlacementRequest,
        start: int,
        end: int,
        now: int,
        notice_ms: int,
        busy: BusyUnits = frozenset(),
    ) -> Preview:
        view = await self._view(pool_id, now)
        return preview(view, req, start, end, now, notice_ms, busy)

    async def unbooked_busy(self, pool_id: str, busy: BusyUnits, now: int) -> int:
        """How many allocatable GPUs of the pool are in unbooked use (`busy`)."""
        node_ids = {node_id for node_id, _ in busy}
        if not node_ids:
            return 0
        view = await self._view(pool_id, now)
        nodes = [view.cache.by_id[n] for n in sorted(node_ids) if n in view.cache.by_id]
        return busy_allocatable(nodes, busy)

    async def _view(self, pool_id: str, now: int) -> PoolView:
        """The pool as the database holds it: from the cache when its counters, peeked
        without a pooled connection (`version_peek`), are current, else read."""
        view = self._snapshots.current(pool_id, await self._peek.fetch(pool_id))
        if view is not None:
            return view
        async with self._db.read() as conn:
            return await self._snapshots.view(conn, pool_id, now)


async def load_draft(
    conn: AsyncConnection,
    locks: TenantLocks,
    pool: PoolWindows,
    reserved: AbstractSet[str],
    pool_id: str,
    tenant_ids: Iterable[str],
    now: int,
) -> Draft:
    """The draft bookings of `pool_id` by these tenants are decided against (call under
    the tenants' quota locks and the pool lock): their quotas, read once, and what
    counts against each from now on."""
    tenants = sorted(set(tenant_ids))
    by_tenant: dict[str, list[Any]] = {}
    committed: dict[tuple[str, str, str | None], list[Commitment]] = {}
    locked_out: set[str] = set()
    for quota in await quotas.of_tenants(conn, tenants, pool_id):
        by_tenant.setdefault(quota.tenant_id, []).append(quota)
        if quota.pool_id is None and quota.tenant_id not in locked_out:
            try:
                await locks.ensure(quota.tenant_id)
            except QuotaLockMissed:
                locked_out.add(quota.tenant_id)
                continue
        committed[(quota.tenant_id, quota.resource, quota.pool_id)] = await quotas.commitments(
            conn, quota.tenant_id, quota.resource, quota.pool_id, now, _FOREVER
        )
    return Draft(pool_id, now, pool, reserved, by_tenant, committed, frozenset(locked_out))


class BookingWriter:
    """Books one request inside a unit of work; the snapshot cache learns of the new
    booking only once the unit of work has committed (`after_commit`)."""

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
        view = await self._snapshots.view(conn, r.pool_id, now)
        draft = await load_draft(
            conn, self._tenant_locks, view, view.reserved_atoms(now), r.pool_id, [r.tenant_id],
            now,
        )  # fmt: skip
        decided = decide(draft, r)
        if isinstance(decided, NotPlaced):
            return decided
        if isinstance(decided, OverQuota):
            raise quotas.exceeded(decided)
        if isinstance(decided, Deferred):
            # Alone, the only deferral is a missed tenant lock: start over, taking it.
            assert decided.reason == LOCKED_OUT
            raise QuotaLockMissed(r.tenant_id)
        noticed = await _notice(conn, decided, now) if decided.victims else ()
        await write_decisions(conn, r.pool_id, [decided], now)
        if not noticed:
            pool_id, version = r.pool_id, view.version + 1
            atoms, scalars = list(decided.atoms), list(decided.scalars)
            # Not `self` in the hook: the unit of work's hook list would hold this
            # writer, which holds the list, a cycle only the full pass frees.
            snapshots = self._snapshots
            self._after_commit(lambda: snapshots.committed(pool_id, version, atoms, scalars))
        # Otherwise the victims' bookings were cut short: the cache reloads.
        return Booked(decided.reservation, noticed, decided.placement.warnings)


async def _notice(conn: AsyncConnection, decision: Decision, now: int) -> tuple[Reservation, ...]:
    """End the victims' bookings at preemptAt and mark them noticed."""
    victims, preempt_at = list(decision.victims), decision.preempt_at
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


async def write_decisions(
    conn: AsyncConnection, pool_id: str, decisions: Sequence[Decision], now: int
) -> None:
    """Write what the decisions booked in `pool_id`, one statement per table: rows,
    claim rows, the bookings version and the rollup's booked columns."""
    if not decisions:
        return
    rows = BookingRows()
    claims: list[dict[str, object]] = []
    allocated: dict[str, int] = {}
    reserved: dict[str, int] = {}
    recount: set[str] = set()
    recount_all = False
    for d in decisions:
        rows.add(d)
        res = d.reservation
        claims += claim_values(res.reservation_id, res.start, res.end, d.claims)
        for cls, n in d.allocated.items():
            allocated[cls] = allocated.get(cls, 0) + n
        for cls, n in d.reserved.items():
            reserved[cls] = reserved.get(cls, 0) + n
        recount |= d.recount
        recount_all |= d.recount_all
    await rows.write(conn)
    await write_claims(conn, claims)
    await bump(conn, [pool_id], bookings=True)
    if recount_all:
        await refresh_booked(conn, pool_id, now)
        return
    await apply_booked_delta(conn, pool_id, allocated, reserved, now)
    if recount:
        await refresh_booked(conn, pool_id, now, recount)


class BookingRows:
    """The rows of one or more new reservations — the reservation, its atom and scalar
    bookings — written with one statement per table."""

    def __init__(self) -> None:
        self.reservations: list[dict[str, Any]] = []
        self.bookings: list[dict[str, Any]] = []
        self.scalars: list[dict[str, Any]] = []

    def add(self, decision: Decision) -> None:
        res = decision.reservation
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
            common | {"node_id": sc.node_id, "resource": sc.resource, "amount": sc.amount}
            for sc in decision.scalars
        ]

    async def write(self, conn: AsyncConnection) -> None:
        await insert_many(conn, schema.reservations, self.reservations)
        await insert_many(conn, schema.bookings, self.bookings)
        await insert_many(conn, schema.scalar_bookings, self.scalars)
