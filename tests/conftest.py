"""Fixtures shared by every test layer: a real nats-server per session, and a ledger
database that is SQLite in a temp dir and, when PostgreSQL is reachable, PostgreSQL too
(a fresh database per test).

`database_url` is a fresh database already at the newest schema: a copy of one migrated
once per session (a file copy on SQLite, `CREATE DATABASE … TEMPLATE` on PostgreSQL), so
the tests do not each pay for the migrations. Opening it still runs the migration check,
which finds nothing to do. `empty_database_url` is a fresh, empty database, for the tests
of the migrations themselves.

PostgreSQL: `GPUFLEET_TEST_POSTGRES_URL` (default postgresql://postgres@127.0.0.1:5432/test)
names a database to connect to for creating the per-test databases. When
`GPUFLEET_TEST_POSTGRES=required` (CI sets it), an unreachable server fails the run
instead of skipping the PostgreSQL half.

`slurm_cluster` is a real Slurm cluster on loopback (tests/slurm_cluster.py), not yet
started.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from coordinator.ledger import Ledger
from ops.kit.embedded_nats import EmbeddedNats
from tests.slurm_cluster import SlurmCluster, require_slurm

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


def _pg_url(name: str) -> str:
    return f"{PG_ADMIN_URL.rsplit('/', 1)[0]}/{name}"


def _require_postgres() -> None:
    if not postgres_available():
        if PG_REQUIRED:
            pytest.fail(f"PostgreSQL required but not reachable at {PG_ADMIN_URL}")
        pytest.skip("PostgreSQL not reachable")


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty ledger database; the test runs once per backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'ledger.db'}"
        return
    _require_postgres()
    name = f"gpufleet_t_{secrets.token_hex(6)}"
    asyncio.run(_pg_execute(f"CREATE DATABASE {name}"))
    try:
        yield _pg_url(name)
    finally:
        asyncio.run(_pg_execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))


async def _migrate(url: str) -> None:
    ledger = await Ledger.open(url)
    await ledger.close()


class MigratedTemplates:
    """One database per backend, migrated once, made on first use and copied per test."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._sqlite: Path | None = None
        self._postgresql: str | None = None

    def sqlite(self) -> Path:
        if self._sqlite is None:
            path = self._directory / "template.db"
            asyncio.run(_migrate(f"sqlite:///{path}"))
            # Closed, so the write-ahead log is checkpointed into the file.
            assert not path.with_name(path.name + "-wal").exists()
            self._sqlite = path
        return self._sqlite

    def postgresql(self) -> str:
        if self._postgresql is None:
            name = f"gpufleet_tmpl_{secrets.token_hex(6)}"
            asyncio.run(_pg_execute(f"CREATE DATABASE {name}"))
            self._postgresql = name
            asyncio.run(_migrate(_pg_url(name)))
        return self._postgresql

    def drop(self) -> None:
        if self._postgresql is not None:
            asyncio.run(_pg_execute(f"DROP DATABASE IF EXISTS {self._postgresql} WITH (FORCE)"))


@pytest.fixture(scope="session")
def migrated_templates(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MigratedTemplates]:
    templates = MigratedTemplates(tmp_path_factory.mktemp("migrated"))
    try:
        yield templates
    finally:
        templates.drop()


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(
    request: pytest.FixtureRequest, tmp_path: Path, migrated_templates: MigratedTemplates
) -> Iterator[str]:
    """A fresh ledger database at the newest schema, nothing in it; the test runs once
    per backend."""
    if request.param == "sqlite":
        path = tmp_path / "ledger.db"
        shutil.copyfile(migrated_templates.sqlite(), path)
        yield f"sqlite:///{path}"
        return
    _require_postgres()
    template = migrated_templates.postgresql()
    name = f"gpufleet_t_{secrets.token_hex(6)}"
    asyncio.run(_pg_execute(f"CREATE DATABASE {name} TEMPLATE {template}"))
    try:
        yield _pg_url(name)
    finally:
        asyncio.run(_pg_execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))


@pytest.fixture
async def ledger(database_url: str) -> AsyncIterator[Ledger]:
    led = await Ledger.open(database_url)
    try:
        yield led
    finally:
        await led.close()


@pytest.fixture
def slurm_cluster(tmp_path: Path) -> Iterator[SlurmCluster]:
    """A real Slurm cluster (munged, slurmctld, a slurmd per node), not yet started: the
    test names files under its `dev_dir`, then calls `start(SlurmConfig(...))`. Stopped at
    the end, its logs and config left in tmp_path/slurm. Skips without the tools or root
    (fails under GPUFLEET_TEST_TOOLS=required)."""
    require_slurm()
    cluster = SlurmCluster()
    try:
        yield cluster
    finally:
        cluster.close(keep_logs=tmp_path / "slurm")
