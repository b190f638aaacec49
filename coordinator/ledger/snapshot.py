"""A pool as the placer needs it for one window, served from memory and kept honest by
per-pool version counters in the database.

Loading 9,000 atoms with their JSON attributes costs tens of milliseconds, so the
snapshot cache keeps, per pool, the nodes and atoms (keyed by `nodes_version`) and the
live bookings (keyed by `bookings_version`). Every transaction that changes either bumps
its counter; a reader compares counters (one primary-key read) and reloads only the part
that moved (`snapshot_loader`, the SQL). A preview peeks at the counters without a pooled
connection first (`version_peek`) and, when they match, reads nothing more.
Inside a booking transaction the counters are read after the pool lock is taken, so the
placer sees exactly what the database holds.
What is held in memory, and the window's view of it, is `domain.pool_cache` (pure);
a batch's `SnapshotDraft` is adopted once the batch has committed.
"""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.domain.booking_spans import BookingSpans
from coordinator.domain.placement_model import PoolSnapshot
from coordinator.domain.pool_cache import (
    HeldAtom,
    HeldScalar,
    PoolCache,
    PoolView,
    SnapshotDraft,
    build_snapshot,
)
from coordinator.domain.ports import Heap
from coordinator.domain.states import node_bucket
from coordinator.ledger.snapshot_loader import bump, load_bookings, load_nodes, versions

__all__ = ["HeldAtom", "HeldScalar", "PoolView", "SnapshotCache", "SnapshotDraft", "bump"]

KEEP_ENDED_MS = 5 * 60 * 1000


class SnapshotCache:
    def __init__(self, heap: Heap | None = None) -> None:
        self._pools: dict[str, PoolCache] = {}
        self.reloads = 0
        # Told of each reload: a reloaded pool's objects are long-lived, and the
        # process may keep them out of the collector's full pass (`runtime.heap`).
        self.heap = heap

    async def snapshot(
        self,
        conn: AsyncConnection,
        pool_id: str,
        start: int,
        end: int,
        now: int,
        ignore_reservations: frozenset[str] = frozenset(),
    ) -> PoolSnapshot:
        cache = await self._fresh(conn, pool_id, now)
        return build_snapshot(cache, start, end, ignore_reservations)

    async def view(self, conn: AsyncConnection, pool_id: str, now: int) -> PoolView:
        """The pool as the database holds it, for any window (read, or decide under the
        pool lock without adding to it)."""
        return PoolView(await self._fresh(conn, pool_id, now))

    def current(self, pool_id: str, versions: tuple[int, int] | None) -> PoolView | None:
        """The pool's view without a read, if the cache holds exactly `versions` (the
        counters as just read by `VersionPeek`); None if it must read."""
        cache = self._pools.get(pool_id)
        if versions is None or cache is None:
            return None
        if (cache.nodes_version, cache.bookings_version) != versions:
            return None
        return PoolView(cache)

    async def draft(self, conn: AsyncConnection, pool_id: str, now: int) -> SnapshotDraft:
        """A private copy of the pool as the database holds it, to which a batch of
        bookings adds each booking as it is decided (call under the pool lock)."""
        return SnapshotDraft((await self._fresh(conn, pool_id, now)).fork())

    async def _fresh(self, conn: AsyncConnection, pool_id: str, now: int) -> PoolCache:
        cache = self._pools.setdefault(pool_id, PoolCache())
        nodes_v, bookings_v = await versions(conn, pool_id)
        reloads = self.reloads
        if cache.nodes_version != nodes_v:
            cache.nodes = await load_nodes(conn, pool_id)
            cache.current = {a.atom_id: (n.node_id, a) for n in cache.nodes for a in n.atoms}
            cache.by_id = {n.node_id: n for n in cache.nodes}
            cache.reset()
            cache.capacity_memory = sum(
                n.capacity.get("memoryGiB", 0)
                for n in cache.nodes
                if node_bucket(n.state) == "allocatable"
            )
            cache.nodes_version = nodes_v
            self.reloads += 1
        if cache.bookings_version != bookings_v:
            # Keep bookings that ended a little before now: a request placed a moment
            # after its `start` was fixed must still see them.
            cache.atoms, cache.scalars = await load_bookings(conn, pool_id, now - KEEP_ENDED_MS)
            cache.by_node, cache.spans = {}, BookingSpans()
            cache.reset()
            cache.index(cache.atoms)
            cache.bookings_version = bookings_v
            self.reloads += 1
        if self.reloads != reloads and self.heap is not None:
            self.heap.reloaded(now)
        return cache

    def committed(
        self,
        pool_id: str,
        bookings_version: int,
        atoms: list[HeldAtom],
        scalars: list[HeldScalar],
    ) -> None:
        """A booking transaction committed, moving the counter from `bookings_version - 1`:
        add its bookings instead of reloading them all."""
        cache = self._pools.get(pool_id)
        if cache is not None and cache.bookings_version == bookings_version - 1:
            # Each atom's device is remembered now (`PoolCache.pinned`): should the atom
            # be retired later, its booking still claims the device.
            cache.add(atoms, scalars)
            cache.bookings_version = bookings_version

    def adopt(self, pool_id: str, draft: SnapshotDraft, booked: bool) -> None:
        """The unit of work that drafted `draft` committed (moving the bookings counter
        by one if it `booked`): the draft, claims it resolved included, becomes the
        cache — unless the cache moved on meanwhile (then it reloads when next read)."""
        cache = self._pools.get(pool_id)
        fork = draft.cache
        if cache is None or cache.bookings_version != draft.version:
            return
        if cache.nodes_version != fork.nodes_version:
            return
        fork.bookings_version = draft.version + (1 if booked else 0)
        self._pools[pool_id] = fork
