"""Many compute bookings of one pool in one unit of work: the ledger half of group commit.

`BookingBatch` is opened inside a unit of work under the pool lock (the tenants' quota
locks first, in the one lock order) with a private draft of the pool's snapshot and the
tenants' quotas, read once. Each request is then decided in memory against the draft —
the pool as committed plus every booking the batch decided before it — so requests of
one batch can never take the same capacity twice, exactly as if they had run one after
the other. A booking that fits is added to the draft and its rows to the batch; a
refusal (or an error) changes nothing, so it never touches its neighbours. `write()`
writes every booking with one statement per table, one version bump and one rollup
update; the snapshot cache learns of them only once the unit of work commits.

A request that would have to preempt spot reservations is not decided here (`Deferred`):
it runs alone through `BookingWriter.book`, which notices victims and writes the outbox;
so does one whose tenant-wide quota lock another writer holds.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.domain.commitments import Commitment, peak
from coordinator.domain.model import Quota
from coordinator.domain.placement_model import NodeSlot, Placement
from coordinator.domain.placer import place
from coordinator.ledger import quotas
from coordinator.ledger.bookings import (
    Booked,
    BookingRequest,
    BookingRows,
    NotPlaced,
    asked_of,
    booked_delta,
    held_of,
    reservation_of,
)
from coordinator.ledger.database import lock_pool
from coordinator.ledger.device_claims import claim_values, rows_for, write_claims
from coordinator.ledger.quotas import QuotaLockMissed, TenantLocks
from coordinator.ledger.rollups import apply_booked_delta, refresh_booked
from coordinator.ledger.snapshot import HeldScalar, SnapshotCache, SnapshotDraft, bump

# Bookings end before this; commitments are read from `now` to here.
_FOREVER = 2**62


@dataclass(frozen=True, slots=True)
class Deferred:
    """Not decided in the batch; the request must run alone."""

    reason: str


class BookingBatch:
    def __init__(
        self,
        conn: AsyncConnection,
        snapshots: SnapshotCache,
        after_commit: Callable[[Callable[[], None]], None],
        tenant_locks: TenantLocks,
        pool_id: str,
        now: int,
        draft: SnapshotDraft,
        quota_list: list[Quota],
    ) -> None:
        self._conn = conn
        self._snapshots = snapshots
        self._after_commit = after_commit
        self._tenant_locks = tenant_locks
        self._pool_id = pool_id
        self._now = now
        self._draft = draft
        self._quotas: dict[str, list[Quota]] = defaultdict(list)
        for quota in quota_list:
            self._quotas[quota.tenant_id].append(quota)
        self._committed: dict[tuple[str, str, str | None], list[Commitment]] = {}
        # What the batch has decided so far.
        self._pending: dict[tuple[str, str], list[Commitment]] = defaultdict(list)
        self._reserved = draft.reserved_atoms(now)
        self._rows = BookingRows()
        self._claims: list[dict[str, object]] = []
        self._scalars: list[HeldScalar] = []
        self._allocated: dict[str, int] = {}
        self._reserved_delta: dict[str, int] = {}
        self._nodes: dict[str, NodeSlot] | None = None

    @classmethod
    async def open(
        cls,
        conn: AsyncConnection,
        snapshots: SnapshotCache,
        after_commit: Callable[[Callable[[], None]], None],
        tenant_locks: TenantLocks,
        pool_id: str,
        tenant_ids: Iterable[str],
        now: int,
    ) -> BookingBatch:
        tenants = sorted(set(tenant_ids))
        await tenant_locks.take_all(tenants)
        await lock_pool(conn, pool_id)
        draft = await snapshots.draft(conn, pool_id, now)
        quota_list = await quotas.of_tenants(conn, tenants, pool_id)
        return cls(conn, snapshots, after_commit, tenant_locks, pool_id, now, draft, quota_list)

    @property
    def booked(self) -> int:
        return len(self._rows.reservations)

    async def book(self, r: BookingRequest) -> Booked | NotPlaced | Deferred:
        """Decide `r` against the pool and what the batch booked before it; raises
        QuotaExceeded. Nothing changes unless it returns `Booked`."""
        assert r.pool_id == self._pool_id
        now = self._now
        start, end = r.start, r.start + r.duration_ms
        snap = self._draft.snapshot(start, end)
        placement = place(r.placement, snap)
        if not placement.fits:
            if not r.placement.spot and place(r.placement, snap, ignore_spot=True).fits:
                return Deferred("it would preempt spot reservations")
            return NotPlaced(placement, None)
        try:
            await self._check_quota(r, placement, start, end)
        except QuotaLockMissed:
            return Deferred("another writer holds the tenant's quota lock")
        if self._nodes is None:
            self._nodes = {n.node_id: n for n in snap.nodes}
        nodes = self._nodes
        reservation = reservation_of(r, placement, start, end, now)
        atoms, scalars = held_of(reservation, placement)
        claims = claim_values(
            reservation.reservation_id,
            start,
            end,
            {p.node_id: rows_for(nodes[p.node_id], p.atoms) for p in placement.chosen},
        )
        unhealthy = {a.atom_id for p in placement.chosen for a in p.atoms if not a.healthy}
        allocated, reserved = booked_delta(atoms, self._reserved, unhealthy, now)
        # Decided: from here on nothing can fail, so the batch state moves all at once.
        self._rows.add(reservation, placement)
        self._claims += claims
        self._draft.add(atoms, scalars)
        self._scalars += scalars
        for cls, n in allocated.items():
            self._allocated[cls] = self._allocated.get(cls, 0) + n
        for cls, n in reserved.items():
            self._reserved_delta[cls] = self._reserved_delta.get(cls, 0) + n
        self._reserved |= {h.atom_id for h in atoms if h.start > now}
        for h in atoms:
            self._pending[(r.tenant_id, h.cls)].append(Commitment(h.start, h.end, 1))
        for sc in scalars:
            self._pending[(r.tenant_id, sc.resource)].append(
                Commitment(sc.start, sc.end, sc.amount)
            )
        return Booked(reservation, ())

    async def _check_quota(
        self, r: BookingRequest, placement: Placement, start: int, end: int
    ) -> None:
        """As `quotas.check`, with the quotas read once per batch and the bookings the
        batch decided before counted too."""
        tenant_quotas = self._quotas.get(r.tenant_id)
        if not tenant_quotas:
            return
        asked = {resource: n for resource, n in asked_of(placement).items() if n > 0}
        for quota in tenant_quotas:
            if quota.resource not in asked:
                continue
            if quota.pool_id is None:
                await self._tenant_locks.ensure(r.tenant_id)
            held = [
                c
                for c in await self._commitments(r.tenant_id, quota.resource, quota.pool_id)
                if c.start < end and c.end > start
            ]
            error = quotas.exceeded(quota, peak(held, start, end), asked[quota.resource])
            if error is not None:
                raise error

    async def _commitments(
        self, tenant_id: str, resource: str, pool_id: str | None
    ) -> list[Commitment]:
        key = (tenant_id, resource, pool_id)
        if key not in self._committed:
            self._committed[key] = await quotas.commitments(
                self._conn, tenant_id, resource, pool_id, self._now, _FOREVER
            )
        # Every booking of the batch is in this pool: it counts in both scopes.
        return self._committed[key] + self._pending.get((tenant_id, resource), [])

    async def write(self) -> None:
        """Write what the batch booked; the cache adopts the draft after the commit."""
        draft, pool_id = self._draft, self._pool_id
        booked = self.booked > 0
        # Even with nothing booked the draft is worth keeping: the claims it resolved.
        self._after_commit(lambda: self._snapshots.adopt(pool_id, draft, booked))
        if not booked:
            return
        conn, now = self._conn, self._now
        await self._rows.write(conn)
        await write_claims(conn, self._claims)
        await bump(conn, [pool_id], bookings=True)
        await apply_booked_delta(conn, pool_id, self._allocated, self._reserved_delta, now)
        scalars = {sc.resource for sc in self._scalars}
        if scalars:
            await refresh_booked(conn, pool_id, now, scalars)
