"""Engine creation for SQLite (default, a file) and PostgreSQL (asyncpg), and migrations.

SQLite runs in WAL mode with a busy timeout; writers take the lock up front
(`BEGIN IMMEDIATE`) so that read-then-write transactions cannot deadlock on upgrade.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
from sqlalchemy import Connection, event
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from coordinator.ledger.migrations import migrate


def normalize_url(url: str) -> str:
    """Accept the URLs operators write and pick the async driver."""
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+asyncpg://" + url.split("://", 1)[1]
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

    def __init__(self, url: str, *, echo: bool = False) -> None:
        self.url = normalize_url(url)
        self.dialect = "sqlite" if self.url.startswith("sqlite") else "postgresql"
        kwargs: dict[str, Any] = {
            "echo": echo,
            "json_serializer": json_dumps,
            "json_deserializer": orjson.loads,
        }
        if self.dialect == "postgresql":
            kwargs.update(pool_size=10, max_overflow=20, pool_pre_ping=True)
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
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        @event.listens_for(sync_engine, "begin")
        def _on_begin(conn: Any) -> None:
            # Readers take no lock in WAL mode; writers take it at BEGIN.
            if conn.get_execution_options().get("gpufleet_readonly"):
                conn.exec_driver_sql("BEGIN")
            else:
                conn.exec_driver_sql("BEGIN IMMEDIATE")

    async def migrate(self) -> list[str]:
        """Bring the schema to the newest revision in one transaction (see `migrations`)."""
        async with self.engine.connect() as conn:
            if self.dialect == "sqlite":
                # Only outside a transaction; the migration checks the references itself.
                await conn.run_sync(_enforce_foreign_keys, False)
            try:
                async with conn.begin():
                    return await conn.run_sync(migrate)
            finally:
                if self.dialect == "sqlite":
                    await conn.run_sync(_enforce_foreign_keys, True)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncConnection]:
        async with self.engine.begin() as conn:
            yield conn

    @asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncConnection]:
        async with self.engine.connect() as conn:
            await conn.execution_options(gpufleet_readonly=True)
            yield conn

    async def dispose(self) -> None:
        await self.engine.dispose()


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
