"""Many compute bookings of one pool in one unit of work: the ledger half of group commit.

`BookingBatch` is opened inside a unit of work under the pool lock (the tenants' quota
locks first, in the one lock order) with one `Draft` (`coordinator/domain/booking.py`):
a private fork of the pool's snapshot and the tenants' quotas, read once. Each request
is decided by `decide` against the draft — the pool as committed plus every booking the
batch decided before it — so requests of one batch can never take the same capacity
twice, exactly as if they had run one after the other. A decision is recorded in the
draft; a refusal (or an error) changes nothing, so it never touches its neighbours.
`write()` writes every decision with `bookings.write_decisions` (one statement per
table, one version bump, one rollup update); the snapshot cache learns of them only
once the unit of work commits.

A request that would have to preempt spot reservations is not decided here (`Deferred`):
it runs alone through `BookingWriter.book`, which notices victims and writes the outbox;
so does one whose tenant-wide quota lock another writer holds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.domain.booking import (
    Booked,
    BookingRequest,
    Decision,
    Deferred,
    Draft,
    NotPlaced,
    OverQuota,
    decide,
)
from coordinator.ledger import quotas
from coordinator.ledger.bookings import load_draft, write_decisions
from coordinator.ledger.database import lock_pool
from coordinator.ledger.quotas import TenantLocks
from coordinator.ledger.snapshot import SnapshotCache, SnapshotDraft


class BookingBatch:
    def __init__(
        self,
        conn: AsyncConnection,
        snapshots: SnapshotCache,
        after_commit: Callable[[Callable[[], None]], None],
        pool: SnapshotDraft,
        draft: Draft,
    ) -> None:
        self._conn = conn
        self._snapshots = snapshots
        self._after_commit = after_commit
        self._pool = pool
        self._draft = draft
        self._decisions: list[Decision] = []

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
        pool = await snapshots.draft(conn, pool_id, now)
        draft = await load_draft(
            conn, tenant_locks, pool, pool.reserved_atoms(now), pool_id, tenants, now
        )
        return cls(conn, snapshots, after_commit, pool, draft)

    @property
    def booked(self) -> int:
        return len(self._decisions)

    async def book(self, r: BookingRequest) -> Booked | NotPlaced | Deferred:
        """Decide `r` against the pool and what the batch booked before it; raises
        QuotaExceeded. Nothing changes unless it returns `Booked`."""
        assert r.pool_id == self._draft.pool_id
        decided = decide(self._draft, r, may_preempt=False)
        if isinstance(decided, OverQuota):
            raise quotas.exceeded(decided)
        if not isinstance(decided, Decision):
            return decided
        self._decisions.append(decided)
        self._draft.record(decided)
        self._pool.add(list(decided.atoms), list(decided.scalars))
        return Booked(decided.reservation, (), decided.placement.warnings)

    async def write(self) -> None:
        """Write what the batch booked; the cache adopts the draft after the commit."""
        pool, pool_id, snapshots = self._pool, self._draft.pool_id, self._snapshots
        booked = self.booked > 0
        # Even with nothing booked the draft is worth keeping: the claims it resolved.
        # Not `self` in the hook: the unit of work's hook list would hold this batch,
        # which holds the list, and the replaced pool cache would wait in that cycle
        # for the collector's full pass (`runtime.heap`).
        self._after_commit(lambda: snapshots.adopt(pool_id, pool, booked))
        await write_decisions(self._conn, pool_id, self._decisions, self._draft.now)
