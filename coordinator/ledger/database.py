"""Engine creation for SQLite (default, a file) and PostgreSQL (asyncpg), and migrations.

SQLite runs in WAL mode; writers take the lock up front (`BEGIN IMMEDIATE`) so that
read-then-write transactions cannot deadlock on upgrade. A writer waits for the lock up
to `SQLITE_LOCK_WAIT_S`, but only a slice of it (`SQLITE_BUSY_SLICE_MS`) inside the
driver's thread, where a cancel cannot reach it: the rest is spent sleeping in the event
loop between tries (`begin`), so a cancelled task leaves within a slice. With the whole
wait in the thread, a coordinator whose loops queued for the lock took up to the full
wait to stop, and its tasks outlived shutdown.

PostgreSQL URLs may name several hosts (`postgresql://u@db1:5432,db2:5432/gpufleet`):
asyncpg tries them in turn and, with `target_session_attrs=read-write` (added when
several hosts are given and the URL does not say otherwise), settles on the primary,
so after a failover new connections find the promoted standby. Pooled connections are
pinged before use; one the database dropped fails the work in flight, which leaves as
`LedgerUnavailable` (503 UNAVAILABLE on the API, a logged and retried iteration in the
loops), never as a driver error. Each connection carries `application_name`
(`gpufleet-coordinator <replica>`), so an operator can tell replicas apart in
`pg_stat_activity`.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
from sqlalchemy import Connection, event
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.ext.asyncio import (
    AsyncConnection,
    AsyncEngine,
    AsyncTransaction,
    create_async_engine,
)

from coordinator.domain.errors import Unavailable
from coordinator.ledger.fence import check_fence
from coordinator.ledger.migrations import migrate

log = logging.getLogger(__name__)

DEFAULT_PG_PORT = 5432
# SQLSTATE classes that mean "the database is away", not "the statement is wrong":
# connection exceptions, operator intervention (terminated, shutting down), read-only
# (a standby after failover), insufficient resources (too many connections).
_AWAY_SQLSTATES = ("08", "57P", "25006", "53")
# How long a SQLite writer waits for the write lock in all (a coordinator migrating the
# same file may hold it for seconds; pysqlite's own 5 s ran out under load), and how
# much of it one try may spend blocked in the driver's thread.
SQLITE_LOCK_WAIT_S = 30.0
SQLITE_BUSY_SLICE_MS = 100
# How long closing the pool may wait on a database that stopped answering.
DISPOSE_TIMEOUT_S = 3.0


class LedgerUnavailable(Unavailable):
    """The database could not be reached, or dropped the connection mid-work; nothing
    of the work was committed, and it may be retried."""


def lost_connection(exc: BaseException) -> bool:
    """Whether `exc` says the database is unreachable rather than the work wrong."""
    if isinstance(exc, OSError | TimeoutError):
        return True
    if isinstance(exc, DBAPIError):
        if exc.connection_invalidated or isinstance(exc, OperationalError | InterfaceError):
            return True
        if exc.statement is None:
            return True  # raised while connecting (e.g. the database refuses connections)
        state = str(getattr(exc.orig, "sqlstate", None) or getattr(exc.orig, "pgcode", ""))
        return state.startswith(_AWAY_SQLSTATES)
    # asyncpg's own, raised before SQLAlchemy wraps anything (no host is a primary).
    return type(exc).__name__ in {"TargetServerAttributeNotMatched", "ConnectionDoesNotExistError"}


def _multi_host(rest: str) -> str:
    """`user@h1:p1,h2/db?q` → `user@/db?q&host=h1:p1&host=h2:5432&target_session_attrs=
    read-write` (SQLAlchemy's asyncpg spelling); one host is left as it is."""
    netloc, _, path = rest.partition("/")
    userinfo, at, hosts_part = netloc.rpartition("@")
    hosts = [h.strip() for h in hosts_part.split(",")]
    if len(hosts) < 2:
        return rest
    with_ports = [
        h if h.rsplit("]", 1)[-1].count(":") == 1 else f"{h}:{DEFAULT_PG_PORT}" for h in hosts
    ]
    dbname, _, query = path.partition("?")
    params = [p for p in query.split("&") if p]
    params += [f"host={h}" for h in with_ports]
    if not any(p.startswith("target_session_attrs=") for p in params):
        params.append("target_session_attrs=read-write")
    return f"{userinfo}{at}/{dbname}?" + "&".join(params)


def normalize_url(url: str) -> str:
    """Accept the URLs operators write and pick the async driver."""
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+asyncpg://" + _multi_host(url.split("://", 1)[1])
    if url.startswith("sqlite:///"):
        return "sqlite+aiosqlite:///" + url[len("sqlite:///") :]
    return url


def json_dumps(value: Any) -> str:
    """JSON columns through orjson (registration writes every node's inventory document);
    what orjson refuses (an integer beyond 64 bits) goes through the standard library."""
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()
    except TypeError:
        return json.dumps(value)


class Database:
    """One async engine plus the transaction helpers every repository uses."""

    def __init__(self, url: str, *, echo: bool = False, application_name: str = "") -> None:
        self.url = normalize_url(url)
        self.dialect = "sqlite" if self.url.startswith("sqlite") else "postgresql"
        kwargs: dict[str, Any] = {
            "echo": echo,
            "json_serializer": json_dumps,
            "json_deserializer": orjson.loads,
        }
        if self.dialect == "postgresql":
            kwargs.update(pool_size=10, max_overflow=20, pool_pre_ping=True)
            if application_name:
                kwargs["connect_args"] = {
                    "server_settings": {"application_name": application_name[:63]}
                }
        self.engine: AsyncEngine = create_async_engine(self.url, **kwargs)
        if self.dialect == "sqlite":
            self._configure_sqlite()

    def _configure_sqlite(self) -> None:
        sync_engine = self.engine.sync_engine

        @event.listens_for(sync_engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            # Let SQLAlchemy, not pysqlite, decide when transactions begin.
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            # The whole wait first: switching a new file to WAL needs the write lock,
            # which another coordinator migrating the same file may hold for seconds;
            # connecting is not where a loop waits when it is cancelled.
            cur.execute(f"PRAGMA busy_timeout={int(SQLITE_LOCK_WAIT_S * 1000)}")
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            # From here on the thread waits a slice at a time (`begin`).
            cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_SLICE_MS}")
            cur.close()

        @event.listens_for(sync_engine, "invalidate")
        def _on_invalidate(dbapi_conn: Any, _record: Any, _exc: BaseException | None) -> None:
            # A connection is invalidated when its work is cancelled (by `connect`, or by
            # SQLAlchemy itself when a statement is interrupted), then closed. SQLite
            # keeps a connection closed while a statement of it lives (the cancelled
            # cursor, in the cancelled task's traceback) as a zombie that holds its
            # transaction's write lock until that statement is gone: every writer in
            # the process waits and fails "locked". So end the transaction first;
            # SQLite's rollback is local and cannot hang as a server's can.
            try:
                dbapi_conn.rollback()
            except Exception as exc:  # the close that follows is what must happen
                log.debug("rollback of an invalidated SQLite connection: %r", exc)

        @event.listens_for(sync_engine, "begin")
        def _on_begin(conn: Any) -> None:
            # Readers take no lock in WAL mode; writers take it at BEGIN.
            if conn.get_execution_options().get("gpufleet_readonly"):
                conn.exec_driver_sql("BEGIN")
            else:
                conn.exec_driver_sql("BEGIN IMMEDIATE")

    @property
    def sqlite_path(self) -> str | None:
        """The SQLite database's file (or `:memory:`); None on PostgreSQL."""
        return self.engine.url.database if self.dialect == "sqlite" else None

    async def migrate(self) -> list[str]:
        """Bring the schema to the newest revision in one transaction (see `migrations`)."""
        async with _one_migrator(self.sqlite_path):
            return await self._migrate()

    async def _migrate(self) -> list[str]:
        async with self.engine.connect() as conn:
            if self.dialect == "sqlite":
                # Only outside a transaction; the migration checks the references itself.
                await conn.run_sync(_enforce_foreign_keys, False)
            try:
                async with self._written(conn):
                    return await conn.run_sync(migrate)
            finally:
                if self.dialect == "sqlite":
                    await conn.run_sync(_enforce_foreign_keys, True)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncConnection]:
        """A write transaction; inside `Leadership.fenced()` it is a leader write and
        begins with the fence check (`coordinator.ledger.fence`)."""
        async with (
            unavailable_on_lost_connection(),
            self.connect() as conn,
            self._written(conn),
        ):
            await check_fence(conn)
            yield conn

    @asynccontextmanager
    async def connect(self) -> AsyncIterator[AsyncConnection]:
        """A pooled connection. One whose work is cancelled is dropped (invalidated)
        rather than rolled back and returned: the rollback waits for the server's
        answer, without end when it stopped answering, and a cancelled loop would wait
        with it (SQLAlchemy shields the close); the server ends the transaction with
        the session."""
        async with self.engine.connect() as conn:
            try:
                yield conn
            except asyncio.CancelledError:
                await conn.invalidate()
                raise

    @asynccontextmanager
    async def _written(self, conn: AsyncConnection) -> AsyncIterator[None]:
        """A write transaction on `conn` (`begin`): committed when the block ends,
        rolled back when it raises (cancelled: dropped with its connection)."""
        tx = await self.begin(conn)
        try:
            yield
        except asyncio.CancelledError:
            raise  # no rollback to wait for: `connect` drops the connection
        except BaseException:
            if tx.is_active:
                await tx.rollback()
            raise
        if tx.is_active:
            await tx.commit()

    async def begin(self, conn: AsyncConnection) -> AsyncTransaction:
        """Begin a write transaction on `conn`. SQLite: tried until the write lock is
        had or `SQLITE_LOCK_WAIT_S` has passed, sleeping between tries in the event loop
        (where a cancel ends the wait at once), each try blocking the driver's thread
        for at most `SQLITE_BUSY_SLICE_MS`."""
        if self.dialect != "sqlite":
            return await conn.begin()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SQLITE_LOCK_WAIT_S
        pause = 0.005
        while True:
            try:
                return await conn.begin()
            except OperationalError as exc:
                if not _sqlite_busy(exc) or loop.time() >= deadline:
                    raise
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.1)

    @asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncConnection]:
        async with unavailable_on_lost_connection(), self.connect() as conn:
            await conn.execution_options(gpufleet_readonly=True)
            yield conn

    async def dispose(self) -> None:
        """Close the pool's connections; a database that stopped answering is left
        after `DISPOSE_TIMEOUT_S` (asyncpg waits for its goodbye without end), its
        connections dropped unclosed."""
        try:
            async with asyncio.timeout(DISPOSE_TIMEOUT_S):
                await self.engine.dispose()
        except TimeoutError:
            log.warning(
                "the database did not answer within %.0f s while its connections were"
                " closed; dropping them",
                DISPOSE_TIMEOUT_S,
            )
            await self.engine.dispose(close=False)


@asynccontextmanager
async def _one_migrator(sqlite_path: str | None) -> AsyncIterator[None]:
    """SQLite: one migrating process at a time, by an OS lock on `<file>.migrate-lock`
    (PostgreSQL's migrations take an advisory lock instead). Two coordinators opening a
    new file at once otherwise deadlock: one migrates while the other, switching the
    file to WAL, holds the shared lock the first needs to commit; both wait out their
    busy timeouts and one start fails with "database is locked"."""
    if not sqlite_path or sqlite_path == ":memory:":
        yield
        return
    fd = os.open(f"{sqlite_path}.migrate-lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        # In a thread: a second migrator in this process must not block the event loop
        # that the first needs in order to finish.
        await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


@asynccontextmanager
async def unavailable_on_lost_connection() -> AsyncIterator[None]:
    """Turn a dropped or refused database connection into `LedgerUnavailable`."""
    try:
        yield
    except Exception as exc:
        if lost_connection(exc):
            raise LedgerUnavailable(
                "the ledger database is unreachable; retry", {"reason": type(exc).__name__}
            ) from exc
        raise


def _sqlite_busy(exc: OperationalError) -> bool:
    """SQLite's "database is locked", in any of its forms: another connection holds the
    write lock (SQLITE_BUSY), or another process is rebuilding the WAL index after a
    crash or a last close (SQLITE_BUSY_RECOVERY); Python reports the extended code, so
    only its low byte says busy."""
    code = getattr(exc.orig, "sqlite_errorcode", None)
    return isinstance(code, int) and code & 0xFF == sqlite3.SQLITE_BUSY


def _enforce_foreign_keys(conn: Connection, on: bool) -> None:
    # On the DBAPI connection: through SQLAlchemy the statement would open a transaction.
    cursor = conn.connection.cursor()
    cursor.execute(f"PRAGMA foreign_keys={'ON' if on else 'OFF'}")
    cursor.close()


async def lock_pool(conn: AsyncConnection, pool_id: str) -> None:
    """Serialise writers of one pool's bookings and booked counts until the transaction
    ends. PostgreSQL: an advisory lock; SQLite: `BEGIN IMMEDIATE` already admits one
    writer at a time."""
    if conn.dialect.name == "postgresql":
        await conn.exec_driver_sql("SELECT pg_advisory_xact_lock(hashtext($1))", (pool_id,))
