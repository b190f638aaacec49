"""A coordinator stops within its grace period however busy its loops are: with the
database's write lock held by another session (every leader loop waits in its first
statement) and its NATS server hung (SIGSTOP: every publish and probe waits), leaving
`running_coordinator` takes about a second (the bus's bounded last flush), and no
shutdown step overruns.

Before the fix a loop waiting for SQLite's lock sat in the driver's thread for the whole
30 s busy timeout, where a cancel cannot reach it: shutdown gave up on the loops after
15 s (`shutdown: loops did not finish within 15 s`) and the loops' tasks outlived the
event loop; the bus drain waited 5 s more on a hung server. On a PostgreSQL server that
stopped answering, a loop cancelled mid-statement waited without end for the rollback
of its connection (SQLAlchemy shields that close from the cancel), and closing the pool
waited for each connection's goodbye."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from urllib.parse import urlsplit

import asyncpg
import pytest

from coordinator.app import running_coordinator
from ops.kit.embedded_nats import EmbeddedNats
from tests.freezable_proxy import FreezableProxy
from tests.integration.conftest import coordinator_settings
from tests.waiting import eventually

# A backstop far below the 15 s a shutdown step may take and the 30 s of SQLite's lock
# wait that a cancel could not cut short: measured 1.03 s with NATS hung (the bus
# flush's bound) and 0.01-0.2 s otherwise, with two cores at load 6.5.
GRACE_S = 5.0


@pytest.fixture
def hung_nats() -> Iterator[EmbeddedNats]:
    """A nats-server of this test's own, to be paused."""
    with EmbeddedNats() as server:
        yield server


@asynccontextmanager
async def write_lock_held(database_url: str) -> AsyncIterator[None]:
    """Another session holds what every leader loop's transaction needs first: SQLite's
    write lock, or every PostgreSQL table (the fence check reads `leader_term`)."""
    if database_url.startswith("sqlite:///"):
        other = sqlite3.connect(database_url.removeprefix("sqlite:///"), isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")
            # No view of SQLite's waiters: a few rounds of the 50 ms loops.
            await asyncio.sleep(0.5)
            yield
        finally:
            other.close()
        return
    conn = await asyncpg.connect(database_url)
    try:
        tables = [
            r[0]
            for r in await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        ]
        # The tables are locked one by one while the coordinator's loops run: one of
        # them may hold a table this statement wants next and want one it already has.
        # PostgreSQL then ends one side; when it ends ours, the loops go on and we ask
        # again.
        while True:
            tx = conn.transaction()
            await tx.start()
            try:
                await conn.execute(f"LOCK TABLE {', '.join(tables)} IN ACCESS EXCLUSIVE MODE")
                break
            except asyncpg.exceptions.DeadlockDetectedError:
                await tx.rollback()

        async def loops_waiting() -> bool:
            waiting = await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND application_name LIKE 'gpufleet-coordinator%'"
                " AND datname = current_database()"
            )
            return bool(waiting)

        await eventually(loops_waiting)
        yield
        await tx.rollback()
    finally:
        await conn.close()


async def test_a_coordinator_with_its_loops_busy_stops_within_its_grace(
    database_url: str, hung_nats: EmbeddedNats, caplog: pytest.LogCaptureFixture
) -> None:
    settings = coordinator_settings(database_url, hung_nats.url, reservation_tick_s=0.05)
    async with AsyncExitStack() as held:
        async with running_coordinator(settings):
            await held.enter_async_context(write_lock_held(database_url))
            hung_nats.pause()
            # A probe is under way or due: the hung server is being waited on.
            await asyncio.sleep(settings.nats.probe_interval_s)
            started = time.monotonic()
        took = time.monotonic() - started
        hung_nats.resume()
    overran = [r.getMessage() for r in caplog.records if "shutdown:" in r.getMessage()]
    assert not overran
    assert took < GRACE_S, f"the coordinator took {took:.1f} s to stop"


async def test_loops_busy_on_the_database_alone_stop_at_once(
    database_url: str, nats_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR)
    settings = coordinator_settings(database_url, nats_url, reservation_tick_s=0.05)
    async with running_coordinator(settings) as c, write_lock_held(database_url):
        started = time.monotonic()
        await c.loops.stop()
        took = time.monotonic() - started
    assert took < GRACE_S, f"the loops took {took:.1f} s to end"


# Measured 3.1 s: the pool's close gives up on the silent server after 3 s.
FROZEN_DB_GRACE_S = 8.0


async def test_a_coordinator_whose_database_stopped_answering_stops_within_its_grace(
    database_url: str, nats_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    if not database_url.startswith("postgresql"):
        pytest.skip("a database server on the network; SQLite is a file")
    url = urlsplit(database_url)
    proxy = FreezableProxy(url.hostname or "127.0.0.1", url.port or 5432)
    await proxy.start()
    via_proxy = url._replace(netloc=f"{url.username}@127.0.0.1:{proxy.port}").geturl()
    settings = coordinator_settings(via_proxy, nats_url, reservation_tick_s=0.05)
    try:
        async with running_coordinator(settings):
            proxy.freeze()
            # No view of statements in flight through a frozen link: a few rounds of
            # the 50 ms loops, each now waiting on the silent server.
            await asyncio.sleep(0.5)
            started = time.monotonic()
        took = time.monotonic() - started
    finally:
        await proxy.close()
    overran = [r.getMessage() for r in caplog.records if "shutdown:" in r.getMessage()]
    assert not overran
    assert took < FROZEN_DB_GRACE_S, f"the coordinator took {took:.1f} s to stop"
