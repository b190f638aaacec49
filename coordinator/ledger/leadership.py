"""Which coordinator replica leads (SPEC §7): the one holding a PostgreSQL session
advisory lock on a dedicated connection. The leader alone writes what heartbeats imply
(transitions, last-seen, unreachable), rebuilds the rollup and runs the reservation
clock; every replica serves the API, whose writes are safe under the ledger's own locks.

SQLite is one process's database, so its only coordinator always leads.
"""

from __future__ import annotations

import logging

from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.ledger.database import Database

log = logging.getLogger(__name__)

LEADER_LOCK = 7_355_609


class Leadership:
    def __init__(self, db: Database, key: int = LEADER_LOCK) -> None:
        self._db = db
        self._key = key
        self._conn: AsyncConnection | None = None
        self.is_leader = db.dialect == "sqlite"
        self.changes = 0

    async def tick(self) -> None:
        """Try to become leader, or check that the lock's connection is still alive."""
        if self._db.dialect == "sqlite":
            return
        try:
            if self._conn is None:
                conn = await self._db.engine.connect()
                # No transaction left open between ticks: the lock is session-level.
                self._conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
            if self.is_leader:
                await self._conn.exec_driver_sql("SELECT 1")
                return
            result = await self._conn.exec_driver_sql(f"SELECT pg_try_advisory_lock({self._key})")
            if result.scalar():
                self._set(True)
        except Exception as exc:
            log.warning("leadership check failed: %s", exc)
            self._set(False)
            await self._drop()

    def _set(self, leader: bool) -> None:
        if leader != self.is_leader:
            self.changes += 1
            log.info("this coordinator %s the leader", "is now" if leader else "is no longer")
        self.is_leader = leader

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                await conn.close()
            except Exception as exc:
                log.debug("closing the leadership connection: %s", exc)

    async def close(self) -> None:
        """Give the lock up at once (closing the session releases it)."""
        if self._db.dialect != "sqlite":
            self._set(False)
        await self._drop()
