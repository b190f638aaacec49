"""Fixtures shared by every test layer: a real nats-server per session, and a ledger
database that is SQLite in a temp dir and, when PostgreSQL is reachable, PostgreSQL too
(a fresh database per test).

PostgreSQL: `GPUFLEET_TEST_POSTGRES_URL` (default postgresql://postgres@127.0.0.1:5432/test)
names a database to connect to for creating the per-test databases. When
`GPUFLEET_TEST_POSTGRES=required` (CI sets it), an unreachable server fails the run
instead of skipping the PostgreSQL half.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from coordinator.ledger import Ledger
from ops.embedded_nats import EmbeddedNats

PG_ADMIN_URL = os.environ.get(
    "GPUFLEET_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)
PG_REQUIRED = os.environ.get("GPUFLEET_TEST_POSTGRES") == "required"


def _asyncpg_dsn(url: str) -> str:
    return url.replace("postgresql+asyncpg://", "postgresql://")


async def _pg_execute(sql: str) -> None:
    import asyncpg

    conn = await asyncio.wait_for(asyncpg.connect(_asyncpg_dsn(PG_ADMIN_URL)), timeout=5)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


_pg_state: dict[str, bool] = {}


def postgres_available() -> bool:
    if "ok" not in _pg_state:
        try:
            asyncio.run(_pg_execute("SELECT 1"))
            _pg_state["ok"] = True
        except Exception:
            _pg_state["ok"] = False
    return _pg_state["ok"]


@pytest.fixture(scope="session")
def nats_server() -> Iterator[EmbeddedNats]:
    with EmbeddedNats() as server:
        yield server


@pytest.fixture
def nats_url(nats_server: EmbeddedNats) -> str:
    if not nats_server.running:
        nats_server.start()
    return nats_server.url


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty ledger database; the test runs once per backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'ledger.db'}"
        return
    if not postgres_available():
        if PG_REQUIRED:
            pytest.fail(f"PostgreSQL required but not reachable at {PG_ADMIN_URL}")
        pytest.skip("PostgreSQL not reachable")
    name = f"gpufleet_t_{secrets.token_hex(6)}"
    asyncio.run(_pg_execute(f"CREATE DATABASE {name}"))
    base = PG_ADMIN_URL.rsplit("/", 1)[0]
    try:
        yield f"{base}/{name}"
    finally:
        asyncio.run(_pg_execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))


@pytest.fixture
async def ledger(database_url: str) -> AsyncIterator[Ledger]:
    led = await Ledger.open(database_url)
    try:
        yield led
    finally:
        await led.close()
