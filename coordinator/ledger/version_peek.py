"""A pool's version counters read on the event loop's own thread, for a SQLite file:
the one database read of a preview whose pool cache is current, without the hop to the
driver's thread (issue 30 point 8).

aiosqlite runs every statement on its connection's thread. For the primary-key read of
`pool_versions` the hand-over costs most of the read (~0.5 ms of 0.6 at p50), and its
tail (the driver thread queued behind the event loop for the GIL) made most of a
preview's p99 at 1,000 nodes: 5.7x a rollup read. The same read on a connection of
this thread costs tens of microseconds and never waits: a WAL reader takes no lock a
writer holds, and this connection's busy timeout is zero, so the rare busy answer (a
WAL recovery under way) or any other error returns None, and the caller reads through
the pool as before. A PostgreSQL read is a network round trip either way, and an
in-memory SQLite database is private to its connection: there the peek is always None.

The connection reads only (`query_only`), outside any transaction between reads, so it
holds back no checkpoint. It belongs to the thread that opened it (SQLite's default);
from another thread it answers None.
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

from sqlalchemy.dialects import sqlite

from coordinator.ledger.database import Database
from coordinator.ledger.snapshot_loader import VERSIONS_SELECT

log = logging.getLogger(__name__)

_SQL = str(VERSIONS_SELECT.compile(dialect=sqlite.dialect()))


class VersionPeek:
    """`read(pool_id)`: the pool's (nodes_version, bookings_version) as committed, or
    None where this cannot answer at once (see the module's docstring)."""

    def __init__(self, db: Database) -> None:
        # Only kept: the file is looked up at the first read (a ledger's repositories
        # touch nothing of the database before they are used).
        self._db = db
        self._off = False
        self._conn: sqlite3.Connection | None = None

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

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except sqlite3.Error as exc:  # another thread's: it goes with its thread
                log.debug("version peek connection not closed: %r", exc)


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
