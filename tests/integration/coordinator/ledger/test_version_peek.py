"""A preview whose pool cache is current reads the pool's version counters without a
pooled connection (issue 30 point 8: on SQLite the driver thread's hand-over, on
PostgreSQL the checkout's round trips, were most of a preview's p99), and still sees at
once what any other ledger on the database wrote, whatever becomes of the peek."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from coordinator.domain.booking import Booked
from coordinator.domain.placement_model import DeviceRequest, PlacementRequest
from coordinator.ledger import Ledger
from coordinator.ledger.database import Database, normalize_url
from coordinator.ledger.version_peek import VersionPeek
from coordinator.services.node_records import record_inventory
from shared.ids import new_pool_id
from tests.database import checkouts, statements
from tests.integration.coordinator.ledger.test_snapshot_claims import (
    book,
    booking,
    inventory,
    whole,
)

NOW = 1_700_000_000_000
HOUR = 3_600_000
TWO = PlacementRequest(devices=(DeviceRequest("gpu", 2),))


@pytest.fixture
async def second(database_url: str) -> AsyncIterator[Ledger]:
    """Another coordinator's ledger on the same database."""
    led = await Ledger.open(database_url)
    try:
        yield led
    finally:
        await led.close()


async def _two_gpu_pool(ledger: Ledger) -> str:
    await ledger.tenants.create("acme", "Acme", NOW)
    pool = new_pool_id()
    await ledger.pools.create(pool, "p", "acme", None, NOW)
    await record_inventory(ledger, inventory(pool, [whole(0), whole(1)]), NOW)
    return pool


async def _fits(ledger: Ledger, pool: str) -> bool:
    return (await ledger.bookings.preview(pool, TWO, NOW, NOW + HOUR, NOW, 120_000)).placement.fits


async def test_a_preview_sees_at_once_what_another_ledger_booked(
    ledger: Ledger, second: Ledger
) -> None:
    pool = await _two_gpu_pool(ledger)
    assert await _fits(ledger, pool) and await _fits(ledger, pool)  # the cache is warm
    assert isinstance(await book(second, booking(pool, "gpu", 2), NOW), Booked)
    assert not await _fits(ledger, pool)  # no read in between, no wait
    assert not await _fits(ledger, pool)


async def test_a_current_preview_takes_no_pooled_connection(ledger: Ledger) -> None:
    pool = await _two_gpu_pool(ledger)
    assert await _fits(ledger, pool)  # the cache is warm (PostgreSQL's peek connected)
    with statements() as seen, checkouts() as taken:
        for _ in range(5):
            assert await _fits(ledger, pool)
    assert taken == []
    if ledger.dialect == "sqlite":
        assert seen == []
    else:  # the counters' primary-key read alone, each over the network
        assert len(seen) == 5 and all("pool_versions" in s for s in seen), seen


async def test_previews_at_once_all_see_what_another_ledger_booked(
    ledger: Ledger, second: Ledger
) -> None:
    """One peek at a time: the previews that find it in use read through the pool."""
    pool = await _two_gpu_pool(ledger)
    assert all(await asyncio.gather(*(_fits(ledger, pool) for _ in range(8))))
    assert isinstance(await book(second, booking(pool, "gpu", 2), NOW), Booked)
    assert not any(await asyncio.gather(*(_fits(ledger, pool) for _ in range(8))))


async def _postgres(database_url: str, sql: str, hold_s: float = 0) -> None:
    """`sql` in a transaction of a connection of the test's own, held `hold_s`."""
    engine = create_async_engine(normalize_url(database_url))
    try:
        async with engine.begin() as conn:
            await conn.execute(text(sql))
            await asyncio.sleep(hold_s)
    finally:
        await engine.dispose()


async def test_a_peek_connection_that_broke_reads_through_the_pool_and_reopens(
    ledger: Ledger, second: Ledger, database_url: str
) -> None:
    if ledger.dialect != "postgresql":
        pytest.skip("the kept connection is PostgreSQL's")
    pool = await _two_gpu_pool(ledger)
    assert await _fits(ledger, pool)
    # Every other session of the test's database ends, the peek's among them, as when
    # the server restarts or a proxy drops an idle connection.
    await _postgres(
        database_url,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )  # fmt: skip
    assert isinstance(await book(second, booking(pool, "gpu", 2), NOW), Booked)
    assert not await _fits(ledger, pool)  # through the pool: it sees the booking
    with checkouts() as taken:
        assert not await _fits(ledger, pool)  # the peek connects again...
        assert not await _fits(ledger, pool)  # ...once
    assert len(taken) == 1


async def test_a_peek_that_waits_too_long_gives_way_to_the_pool(
    ledger: Ledger, database_url: str
) -> None:
    if ledger.dialect != "postgresql":
        pytest.skip("the kept connection is PostgreSQL's")
    pool = await _two_gpu_pool(ledger)
    assert await _fits(ledger, pool)
    # A lock that even a read waits for (as DDL takes): the peek gives up after its
    # second, the preview waits on a pooled connection for the lock like any read, and
    # the abandoned peek's connection is dropped, not reused mid-answer.
    locker = asyncio.create_task(
        _postgres(database_url, "LOCK TABLE pool_versions IN ACCESS EXCLUSIVE MODE", 1.5)
    )
    try:
        await asyncio.sleep(0.2)
        assert await _fits(ledger, pool)
    finally:
        await locker
    with checkouts() as taken:
        assert await _fits(ledger, pool)
        assert await _fits(ledger, pool)
    assert len(taken) == 1


async def test_the_peek_never_makes_a_file_nor_waits_for_a_writer(tmp_path: Path) -> None:
    missing = tmp_path / "gone.db"
    peek = VersionPeek(Database(f"sqlite:///{missing}"))
    assert peek.read("pool") is None and not missing.exists()

    path = tmp_path / "ledger.db"
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute(
        "CREATE TABLE pool_versions (pool_id TEXT PRIMARY KEY, nodes_version INTEGER,"
        " bookings_version INTEGER)"
    )
    writer.execute("INSERT INTO pool_versions VALUES ('p', 3, 7)")
    peek = VersionPeek(Database(f"sqlite:///{path}"))
    try:
        assert peek.read("p") == (3, 7)
        assert peek.read("other") == (0, 0)  # a pool never written: the counters' start
        # A writer in the middle of a transaction: the peek answers what is committed.
        writer.execute("BEGIN IMMEDIATE")
        writer.execute("UPDATE pool_versions SET bookings_version = 8")
        assert peek.read("p") == (3, 7)
        writer.execute("COMMIT")
        assert peek.read("p") == (3, 8)
        # A peek keeps no read snapshot open: a checkpoint empties the WAL past it.
        busy, _, _ = writer.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        assert busy == 0
        # The connection is the opening thread's; another thread gets None, not an error.
        answers: list[object] = []
        thread = threading.Thread(target=lambda: answers.append(peek.read("p")))
        thread.start()
        thread.join()
        assert answers == [None]
    finally:
        await peek.close()
        writer.close()
    assert VersionPeek(Database("postgresql://u@127.0.0.1:1/none")).read("p") is None
    assert VersionPeek(Database("sqlite:///:memory:")).read("p") is None
