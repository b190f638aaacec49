"""`Ledger`: the repositories behind one database, as the rest of the coordinator sees it."""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractAsyncContextManager
from dataclasses import replace

from sqlalchemy import select

from coordinator.domain.census import Census
from coordinator.domain.consumption import consumption
from coordinator.domain.idempotency import Recorded
from coordinator.domain.intervals import INTERVAL_MS
from coordinator.domain.model import RollupRow
from coordinator.domain.ports import Heap
from coordinator.ledger import idempotency, schema
from coordinator.ledger.booked_spans import BookedSpanRepo
from coordinator.ledger.bookings import BookingRepo
from coordinator.ledger.catalog import Catalog
from coordinator.ledger.census import read_census
from coordinator.ledger.database import Database, lock_pool
from coordinator.ledger.focus_facts import FocusFacts
from coordinator.ledger.gpu_listing import GpuListing
from coordinator.ledger.gpu_use import GpuUseRepo
from coordinator.ledger.intervals import IntervalRepo
from coordinator.ledger.leadership import Leadership
from coordinator.ledger.memory_use import MemoryUseRepo
from coordinator.ledger.model_totals import gpu_model_totals
from coordinator.ledger.node_bookings import NodeBookingRepo
from coordinator.ledger.nodes import NodeRepo
from coordinator.ledger.outbox import OutboxRepo
from coordinator.ledger.pool_memory import PoolMemoryRisk
from coordinator.ledger.pools import PoolRepo
from coordinator.ledger.projects import ProjectRepo
from coordinator.ledger.quotas import QuotaRepo
from coordinator.ledger.reservation_listing import ReservationListing
from coordinator.ledger.reservations import ReservationRepo
from coordinator.ledger.rollups import read_rollup, rebuild_pool
from coordinator.ledger.shapes import ShapeRepo
from coordinator.ledger.snapshot import SnapshotCache
from coordinator.ledger.tenants import ApiKeyRepo, TenantRepo
from coordinator.ledger.unit_of_work import UnitOfWork, unit_of_work
from coordinator.ledger.version_peek import VersionPeek


class Ledger:
    def __init__(self, db: Database, heap: Heap | None = None) -> None:
        self._db = db
        self._heap = heap
        self.tenants = TenantRepo(db)
        self.keys = ApiKeyRepo(db)
        self.projects = ProjectRepo(db)
        self.pools = PoolRepo(db)
        self.nodes = NodeRepo(db)
        self.catalog = Catalog(db)
        self.gpus = GpuListing(db)
        self.quotas = QuotaRepo(db)
        self.snapshots = SnapshotCache(heap)
        self._peek = VersionPeek(db)
        self.bookings = BookingRepo(db, self.snapshots, self._peek)
        self.reservations = ReservationRepo(db)
        self.intervals = IntervalRepo(db)
        self.listing = ReservationListing(db)
        self.booked_spans = BookedSpanRepo(db)
        self.gpu_use = GpuUseRepo(db)
        self.memory_use = MemoryUseRepo(db)
        self.focus_facts = FocusFacts(db)
        self.outbox = OutboxRepo(db)
        self.shapes = ShapeRepo(db)
        self.pool_memory = PoolMemoryRisk(db)
        self.node_bookings = NodeBookingRepo(db)

    @classmethod
    async def open(
        cls, url: str, *, application_name: str = "", heap: Heap | None = None
    ) -> Ledger:
        """The ledger at `url`, migrated; `heap`: told when a pool cache is reloaded
        (the coordinator keeps those objects out of the collector's full pass)."""
        db = Database(url, application_name=application_name)
        try:
            await db.migrate()
        except BaseException:
            await db.dispose()
            raise
        return cls(db, heap)

    async def close(self) -> None:
        await self._peek.close()
        await self._db.dispose()
        if self._heap is not None:
            self._heap.release()

    @property
    def dialect(self) -> str:
        return self._db.dialect

    @property
    def database(self) -> Database:
        """The store below the repositories, for benchmarks and tests that time or
        inspect it directly (a bare commit as a baseline, every booking row); the
        coordinator itself goes through the repositories and units of work."""
        return self._db

    async def migrate(self) -> list[str]:
        """Apply the migrations not yet applied; returns their numbers."""
        return await self._db.migrate()

    def transaction(self) -> AbstractAsyncContextManager[UnitOfWork]:
        """One unit of work: `async with ledger.transaction() as uow: ...; await
        uow.commit()`. Leaving without `commit()` rolls back."""
        return unit_of_work(self._db, self.snapshots)

    def leadership(self, holder: str = "") -> Leadership:
        """A leadership contender on its own connection (see `leadership.py`); `holder`
        names this replica in the leader term."""
        return Leadership(self._db, holder=holder)

    async def rollup(self, pool_ids: Iterable[str]) -> dict[str, list[RollupRow]]:
        async with self._db.read() as conn:
            return await read_rollup(conn, pool_ids)

    async def gpu_models(
        self, pool_ids: Iterable[str], now: int
    ) -> dict[str, dict[str, dict[str, int]]]:
        """Per pool, whole GPUs per reported model (`ledger.model_totals`)."""
        async with self._db.read() as conn:
            return {p: await gpu_model_totals(conn, p, now) for p in pool_ids}

    async def census(self, now: int) -> Census:
        """Pools, rollup, nodes and whole GPUs with their holders at `now`, and memory
        reserved against used in the last complete interval before it (for metrics)."""
        census = await read_census(self._db, self.pools, now)
        last = now - now % INTERVAL_MS - INTERVAL_MS
        reserved = await self.memory_use.reserved(last, last + INTERVAL_MS)
        used = await self.memory_use.used(last, last + INTERVAL_MS)
        return replace(census, memory=tuple(consumption(reserved, used)))

    async def rebuild_all(self, now: int) -> int:
        """Recompute every pool's rows; returns how many rows had drifted."""
        async with self._db.read() as conn:
            pool_ids = (await conn.execute(select(schema.pools.c.pool_id))).scalars().all()
        drift = 0
        for pool_id in pool_ids:
            async with self._db.transaction() as conn:
                await lock_pool(conn, pool_id)
                drift += await rebuild_pool(conn, pool_id, now)
        return drift

    async def recorded(
        self, tenant_id: str, endpoint: str, key: str, digest: str
    ) -> Recorded | None:
        """The answer recorded under an idempotency key (None if none; a different body
        under the key is IDEMPOTENCY_KEY_CONFLICT), read before any validation."""
        return await idempotency.recorded(self._db, tenant_id, endpoint, key, digest)

    async def purge_idempotency(self, now: int, keep_ms: int) -> int:
        """Drop idempotency records older than `keep_ms`; returns how many."""
        return await idempotency.purge(self._db, now, keep_ms)
