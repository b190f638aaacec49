"""Which coordinator replica leads (SPEC §7): the one holding a PostgreSQL session
advisory lock on a dedicated connection. The leader alone writes what heartbeats imply
(transitions, last-seen, unreachable), rebuilds the rollup, runs the reservation clock
and drains the alert outbox; every replica serves the API, whose writes are safe under
the ledger's own locks.

Taking the lock is not yet leading: the new leader first bumps the `leader_term` epoch
(that UPDATE waits for the old leader's fenced writes still in flight), and its leader
loops run under `fenced()`, so each of their transactions checks the lock and the epoch
first (`coordinator.ledger.fence`). A replica whose lock session is gone therefore
writes nothing more, and steps down at its next write or check, whichever comes first.

SQLite is one process's database, so its only coordinator always leads.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import AbstractContextManager, nullcontext

from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.ledger.database import Database
from coordinator.ledger.fence import FenceToken, fenced

log = logging.getLogger(__name__)

LEADER_LOCK = 7_355_609
# How long a new leader waits for the old one's writes in flight before trying later.
TAKEOVER_LOCK_TIMEOUT = "5s"
DROP_TIMEOUT_S = 5.0

_BUMP = (
    "UPDATE leader_term SET epoch = epoch + 1, holder = $1, since = $2"
    " WHERE term_id = 1 RETURNING epoch"
)


class Leadership:
    def __init__(self, db: Database, key: int = LEADER_LOCK, holder: str = "") -> None:
        self._db = db
        self._key = key
        self._holder = holder
        self._conn: AsyncConnection | None = None
        self._token: FenceToken | None = None
        self.is_leader = db.dialect == "sqlite"
        self.changes = 0
        # Leader writes refused because the lock or the term was lost.
        self.fenced_refusals = 0

    @property
    def epoch(self) -> int | None:
        return self._token.epoch if self._token is not None else None

    def token(self) -> FenceToken | None:
        return self._token if self.is_leader else None

    def lost(self, why: str) -> None:
        """A fenced write found the lock or the term gone: step down now; the next tick
        reconnects and competes again."""
        self.fenced_refusals += 1
        if self.is_leader:
            log.warning("leadership lost: %s", why)
        self._set(False)

    def fenced(self) -> AbstractContextManager[None]:
        """Ledger transactions opened inside are leader writes (checked first)."""
        if self._db.dialect == "sqlite":
            return nullcontext()
        return fenced(self)

    async def tick(self, now: int = 0) -> None:
        """Try to become leader, or check that the lock's connection is still alive."""
        if self._db.dialect == "sqlite":
            return
        try:
            if self._conn is None:
                conn = await self._db.engine.connect()
                # No transaction left open between ticks: the lock is session-level.
                self._conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
                await self._conn.exec_driver_sql(f"SET lock_timeout = '{TAKEOVER_LOCK_TIMEOUT}'")
            if self.is_leader:
                await self._conn.exec_driver_sql("SELECT 1")
                return
            if self._token is not None:
                # Stepped down after a fenced refusal while the session lived: let go.
                await self._conn.exec_driver_sql(f"SELECT pg_advisory_unlock({self._key})")
                self._token = None
            result = await self._conn.exec_driver_sql(f"SELECT pg_try_advisory_lock({self._key})")
            if result.scalar():
                await self._take_over(self._conn, now)
        except Exception as exc:
            log.warning("leadership check failed: %s", exc)
            self._token = None
            self._set(False)
            await self._drop()

    async def _take_over(self, conn: AsyncConnection, now: int) -> None:
        pid = (await conn.exec_driver_sql("SELECT pg_backend_pid()")).scalar_one()
        try:
            epoch = (await conn.exec_driver_sql(_BUMP, (self._holder, now))).scalar_one()
        except Exception:
            # The old leader still has writes in flight past the timeout: try later.
            await conn.exec_driver_sql(f"SELECT pg_advisory_unlock({self._key})")
            raise
        self._token = FenceToken(self._key, int(pid), int(epoch))
        log.info("leader term %d begins (%s)", epoch, self._holder or "this coordinator")
        self._set(True)

    def _set(self, leader: bool) -> None:
        if leader != self.is_leader:
            self.changes += 1
            log.info("this coordinator %s the leader", "is now" if leader else "is no longer")
        self.is_leader = leader

    async def _drop(self) -> None:
        """End the lock's session for good: invalidated, not returned to the pool, where
        a live session would go on holding the lock for some other use."""
        conn, self._conn = self._conn, None
        if conn is not None:
            # Bounded: a session the database stopped answering must not hold us up.
            try:
                await asyncio.wait_for(conn.invalidate(), timeout=DROP_TIMEOUT_S)
            except Exception as exc:
                log.debug("invalidating the leadership connection: %s", exc)
            try:
                await asyncio.wait_for(conn.close(), timeout=DROP_TIMEOUT_S)
            except Exception as exc:
                log.debug("closing the leadership connection: %s", exc)

    async def close(self) -> None:
        """Give the lock up at once (closing the session releases it)."""
        if self._db.dialect != "sqlite":
            self._set(False)
        self._token = None
        await self._drop()
