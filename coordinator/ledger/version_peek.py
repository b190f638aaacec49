"""A pool's version counters read without a pooled connection: the one database read of
a preview whose pool cache is current (issue 30 point 8).

SQLite: on the event loop's own thread. aiosqlite runs every statement on its
connection's thread. For the primary-key read of `pool_versions` the hand-over costs
most of the read (~0.5 ms of 0.6 at p50), and its tail (the driver thread queued behind
the event loop for the GIL) made most of a preview's p99 at 1,000 nodes: 5.7x a rollup
read. The same read on a connection of this thread costs tens of microseconds and never
waits: a WAL reader takes no lock a writer holds, and this connection's busy timeout is
zero, so the rare busy answer (a WAL recovery under way) or any other error returns
None, and the caller reads through the pool as before. The connection reads only
(`query_only`), outside any transaction between reads, so it holds back no checkpoint.
It belongs to the thread that opened it (SQLite's default); from another thread it
answers None. An in-memory database is private to its connection: there the peek is
always None.

PostgreSQL: on one connection kept for it, in autocommit. Through the pool the read
was four round trips (the checkout's pre-ping, BEGIN, the SELECT, the ROLLBACK at
return), and they were both a preview's median and its tail (3.4x a rollup read in a
full `bench/run`); here it is the SELECT alone, whose answer is what is committed, as
the pool's read-committed transaction would see it. One peek at a time: a preview that
finds it in use, a peek slower than `PEEK_WAIT_S`, a failed one, a connection that
broke, all read through the pool as before; a failed or interrupted peek drops its
connection (the next peek opens another).
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from pathlib import Path

from sqlalchemy.dialects import sqlite
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.ledger.database import Database
from coordinator.ledger.snapshot_loader import VERSIONS_SELECT

log = logging.getLogger(__name__)

_SQL = str(VERSIONS_SELECT.compile(dialect=sqlite.dialect()))
# A PostgreSQL peek gives up after this and the preview reads through the pool.
PEEK_WAIT_S = 1.0


class VersionPeek:
    """`fetch(pool_id)`: the pool's (nodes_version, bookings_version) as committed, or
    None where this cannot answer at once (see the module's docstring); `read` is
    SQLite's, on the calling thread."""

    def __init__(self, db: Database) -> None:
        # Only kept: the file is looked up at the first read (a ledger's repositories
        # touch nothing of the database before they are used).
        self._db = db
        self._off = False
        self._conn: sqlite3.Connection | None = None
        self._server: AsyncConnection | None = None
        self._server_busy = False

    async def fetch(self, pool_id: str) -> tuple[int, int] | None:
        if self._db.dialect == "sqlite":
            return self.read(pool_id)
        if self._server_busy:
            return None
        self._server_busy = True
        try:
            async with asyncio.timeout(PEEK_WAIT_S):
                if self._server is None:
                    self._server = await self._db.engine.connect()
                    # Each statement its own transaction: no BEGIN, no ROLLBACK.
                    await self._server.execution_options(isolation_level="AUTOCOMMIT")
                rows = (await self._server.execute(VERSIONS_SELECT, {"w_pool": pool_id})).all()
        except (SQLAlchemyError, OSError, TimeoutError) as exc:
            log.debug("pool versions not peeked (%r); reading through the pool", exc)
            await self._drop_server()
            return None
        except asyncio.CancelledError:
            await self._drop_server()  # its answer may still be on the way
            raise
        finally:
            self._server_busy = False
        return (int(rows[0][0]), int(rows[0][1])) if rows else (0, 0)

    def read(self, pool_id: str) -> tuple[int, int] | None:
        if self._off:
            return None
        try:
            if self._conn is None:
                path = self._db.sqlite_path
                if not path or path == ":memory:":
                    self._off = True
                    return None
                self._conn = _open(path)
            # All rows (one at most): the statement runs to its end and ends its read
            # snapshot here; one left open would hold back every WAL checkpoint.
            rows = self._conn.execute(_SQL, (pool_id,)).fetchall()
        except sqlite3.Error as exc:
            log.debug("pool versions not peeked (%r); reading through the pool", exc)
            return None
        return (int(rows[0][0]), int(rows[0][1])) if rows else (0, 0)

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except sqlite3.Error as exc:  # another thread's: it goes with its thread
                log.debug("version peek connection not closed: %r", exc)
        server, self._server = self._server, None
        if server is not None:
            try:
                async with asyncio.timeout(PEEK_WAIT_S):
                    await server.close()
            except (SQLAlchemyError, OSError, TimeoutError) as exc:
                log.debug("version peek connection not closed: %r", exc)
                await server.invalidate()

    async def _drop_server(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            try:
                await server.invalidate()
            except (SQLAlchemyError, OSError) as exc:
                log.debug("version peek connection not dropped cleanly: %r", exc)


def _open(path: str) -> sqlite3.Connection:
    # mode=rw: a file that is gone is an error, not a new empty database. timeout=0:
    # never wait for a lock (pysqlite waits 5 s by default). Autocommit: each read is
    # its own snapshot of what is committed.
    uri = f"{Path(path).absolute().as_uri()}?mode=rw"
    conn = sqlite3.connect(uri, timeout=0, isolation_level=None, uri=True)
    try:
        conn.execute("PRAGMA query_only=1")
    except sqlite3.Error:
        conn.close()
        raise
    return conn
