"""`UnitOfWork`: one ledger transaction that a workflow drives and commits once.

A workflow (see `coordinator/services/`) opens it with `Ledger.transaction()`, takes the
locks it needs in the one lock order (the tenant's quota lock, pools sorted, then
reservation rows), replays or records idempotent answers and writes through the
writers bound to the same connection; nothing is durable until `commit()`. Leaving the
block without committing rolls everything back, so an early return (a replay, a
refusal) can never leave half a write behind. A uniqueness clash — a concurrent
duplicate recorded first, or PostgreSQL's exclusion constraint catching an overlap —
leaves as `WriteRaced`, which a workflow retries on a fresh transaction, as does a
tenant-wide quota that appeared after the work chose not to take the tenant's lock; no
driver error crosses this boundary.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager

from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncTransaction

from coordinator.domain.errors import Unavailable
from coordinator.domain.idempotency import Recorded, Stored
from coordinator.ledger import idempotency
from coordinator.ledger.booking_batch import BookingBatch
from coordinator.ledger.bookings import BookingWriter
from coordinator.ledger.database import Database, lock_pool, unavailable_on_lost_connection
from coordinator.ledger.extensions import ReservationExtender
from coordinator.ledger.fence import check_fence
from coordinator.ledger.intervals import IntervalWriter
from coordinator.ledger.outbox import OutboxWriter
from coordinator.ledger.quotas import QuotaLockMissed, TenantLocks
from coordinator.ledger.reservations import ReservationWriter
from coordinator.ledger.snapshot import SnapshotCache


class WriteRaced(Unavailable):
    """A concurrent writer committed first; the work may be retried from the start."""


class IdempotencyRecords:
    """(tenant, endpoint, key) → the first answer, inside the unit of work."""

    def __init__(self, conn: AsyncConnection) -> None:
        self._conn = conn

    async def lookup(self, tenant_id: str, endpoint: str, key: str, digest: str) -> Recorded | None:
        return await idempotency.lookup(self._conn, tenant_id, endpoint, key, digest)

    async def store(
        self, tenant_id: str, endpoint: str, key: str, digest: str, answer: Recorded,
        now: int,
    ) -> None:  # fmt: skip
        await idempotency.store(
            self._conn, tenant_id, endpoint, key, digest, answer.status, answer.response, now
        )

    async def lookup_many(
        self, endpoint: str, keys: Iterable[tuple[str, str]]
    ) -> dict[tuple[str, str], Stored]:
        """(tenant, key) → the answer stored and its body's hash, of those recorded;
        the domain's `matching` turns one into the answer for a request, or its key
        conflict."""
        return await idempotency.lookup_many(self._conn, endpoint, keys)

    async def store_many(
        self, endpoint: str, answers: Iterable[tuple[str, str, str, Recorded]],
        now: int,
    ) -> None:  # fmt: skip
        """Record (tenant, key, body hash, answer) of many requests in one statement."""
        await idempotency.store_many(self._conn, endpoint, answers, now)


class UnitOfWork:
    def __init__(
        self, conn: AsyncConnection, tx: AsyncTransaction, snapshots: SnapshotCache
    ) -> None:
        self._conn = conn
        self._tx = tx
        self._snapshots = snapshots
        self._after_commit: list[Callable[[], None]] = []
        self.committed = False
        self._tenant_locks = TenantLocks(conn)
        self.idempotency = IdempotencyRecords(conn)
        self.bookings = BookingWriter(
            conn, snapshots, self._after_commit.append, self._tenant_locks
        )
        self.reservations = ReservationWriter(conn)
        self.extensions = ReservationExtender(conn, snapshots)
        self.intervals = IntervalWriter(conn, self._tenant_locks)
        # Alerts about what this unit of work records, committed with it.
        self.outbox = OutboxWriter(conn)

    async def lock_tenant(self, tenant_id: str) -> None:
        """Serialise with every other writer checking the tenant's tenant-wide quota (if
        it has one) until the end. First in the lock order: before any pool lock."""
        await self._tenant_locks.take(tenant_id)

    async def lock_pools(self, *pool_ids: str) -> None:
        """Serialise with every other writer of these pools until the end (sorted, so two
        units of work never wait on each other in opposite orders). Lock order: the
        tenant's quota lock, then pools, then reservation rows."""
        for pool_id in sorted(set(pool_ids)):
            await lock_pool(self._conn, pool_id)

    async def booking_batch(
        self, pool_id: str, tenant_ids: Iterable[str], now: int
    ) -> BookingBatch:
        """Book many requests of one pool in this unit of work (see `booking_batch`):
        takes the tenants' quota locks, then the pool lock — nothing else may be locked
        before."""
        return await BookingBatch.open(
            self._conn, self._snapshots, self._after_commit.append, self._tenant_locks,
            pool_id, tenant_ids, now,
        )  # fmt: skip

    async def commit(self) -> None:
        if self.committed:
            raise RuntimeError("a unit of work commits once")
        await self._tx.commit()
        self.committed = True
        # Only now that it is durable may in-memory caches learn of what was written.
        for hook in self._after_commit:
            hook()


@asynccontextmanager
async def unit_of_work(db: Database, snapshots: SnapshotCache) -> AsyncIterator[UnitOfWork]:
    try:
        async with unavailable_on_lost_connection(), db.connect() as conn:
            tx = await db.begin(conn)
            await check_fence(conn)
            uow = UnitOfWork(conn, tx, snapshots)
            try:
                yield uow
            except asyncio.CancelledError:
                raise  # no rollback to wait for: `Database.connect` drops the connection
            except BaseException:
                if tx.is_active:
                    await tx.rollback()
                raise
            if tx.is_active:
                await tx.rollback()
    except (IntegrityError, QuotaLockMissed) as exc:
        raise WriteRaced("the ledger was too busy to write; retry") from exc
