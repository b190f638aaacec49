"""A SQLite writer waits for another session's write lock as long as it always did (up
to 30 s: a coordinator migrating the same file holds it for seconds), whichever kind of
busy SQLite reports (another writer, or another process recovering the WAL index), but
the wait is the event loop's, not the driver thread's: a cancelled writer leaves at once
(see tests/integration/coordinator/app/test_coordinator_stops_busy.py for the whole
coordinator)."""

from __future__ import annotations

import asyncio
import sqlite3
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, text

from coordinator.ledger import Ledger
from coordinator.ledger.database import SQLITE_BUSY_SLICE_MS, Database

NOW = 1_800_000_000_000


@pytest.fixture
async def ledger(tmp_path: Path) -> AsyncIterator[Ledger]:
    led = await Ledger.open(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        yield led
    finally:
        await led.close()


@pytest.fixture
def other_session(tmp_path: Path, ledger: Ledger) -> Iterator[sqlite3.Connection]:
    """Another connection to the same file, holding its write lock."""
    other = sqlite3.connect(tmp_path / "ledger.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        yield other
    finally:
        other.close()


async def test_a_writer_waits_out_a_lock_held_longer_than_one_try(
    ledger: Ledger, other_session: sqlite3.Connection
) -> None:
    held_s = 10 * SQLITE_BUSY_SLICE_MS / 1000
    asyncio.get_running_loop().call_later(held_s, other_session.execute, "COMMIT")
    started = time.monotonic()
    await ledger.tenants.create("acme", "Acme", NOW)
    assert time.monotonic() - started >= held_s
    assert [t.tenant_id for t in await ledger.tenants.list()] == ["acme"]


# Another process rebuilding the WAL index: it holds SQLite's recovery lock (byte 122 of
# the `-shm` file: the shared-memory lock area starts at 120, the recovery lock is its
# third) with the index header invalid, as a process does while it reads a large WAL
# after a crash or a last close. Everyone else meanwhile gets SQLITE_BUSY_RECOVERY.
_RECOVERING = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.lockf(fd, fcntl.LOCK_EX, 1, 122)
os.pwrite(fd, bytes(136), 0)
print("recovering", flush=True)
time.sleep(float(sys.argv[2]))
"""


async def test_a_writer_waits_out_another_process_recovering_the_wal(
    ledger: Ledger, tmp_path: Path
) -> None:
    """A coordinator starting while another process (the one that just stopped, or a
    second replica) recovers the file's WAL index waits for it, as for a write lock;
    before, its migration failed at once with "database is locked" (a flaky start of
    the coordinator on a loaded machine)."""
    held_s = 10 * SQLITE_BUSY_SLICE_MS / 1000
    shm = tmp_path / "ledger.db-shm"
    assert shm.exists()
    other = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _RECOVERING, str(shm), str(held_s), stdout=asyncio.subprocess.PIPE
    )
    try:
        assert other.stdout is not None
        assert await asyncio.wait_for(other.stdout.readline(), 30) == b"recovering\n"
        started = time.monotonic()
        await ledger.tenants.create("acme", "Acme", NOW)
        assert time.monotonic() - started >= held_s / 2
        assert await asyncio.wait_for(other.wait(), 30) == 0
    finally:
        if other.returncode is None:
            other.kill()
            await other.wait()
    assert [t.tenant_id for t in await ledger.tenants.list()] == ["acme"]


async def test_a_writer_waiting_for_the_lock_is_cancelled_within_a_try(
    ledger: Ledger, other_session: sqlite3.Connection
) -> None:
    writer = asyncio.create_task(ledger.tenants.create("acme", "Acme", NOW))
    await asyncio.sleep(3 * SQLITE_BUSY_SLICE_MS / 1000)  # a few tries in
    started = time.monotonic()
    writer.cancel()
    # A backstop: one try is 0.1 s; before, the thread held the cancel for 30 s.
    done, _ = await asyncio.wait({writer}, timeout=5)
    assert done, "the writer did not leave within 5 s of its cancel"
    assert writer.cancelled()
    assert time.monotonic() - started < 5


def _writable(path: Path) -> bool:
    probe = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        probe.execute("BEGIN IMMEDIATE")
        probe.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        probe.close()


async def test_a_write_cancelled_mid_statement_frees_the_file_while_its_task_lives(
    tmp_path: Path, ledger: Ledger
) -> None:
    """A loop cancelled at shutdown in the middle of a statement of a write transaction,
    its task still referenced (a stopped coordinator keeps its loops' tasks, and each
    task its cancellation's traceback, which holds the statement's cursor): the file is
    writable as soon as the task has ended. Before, the connection was dropped without
    a rollback, SQLite kept it as a zombie holding the write lock for as long as that
    cursor lived, and the next coordinator started in the process failed "database is
    locked" after waiting 30 s."""
    path = tmp_path / "ledger.db"
    db = Database(f"sqlite:///{path}")
    # A statement that stays in the driver's thread until the test lets it go.
    entered, release = threading.Event(), threading.Event()

    def hold(_: object) -> int:
        entered.set()
        release.wait(30)
        return 1

    @event.listens_for(db.engine.sync_engine, "connect")
    def _hold_function(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.create_function("hold", 1, hold)

    try:

        async def write() -> None:
            async with db.transaction() as conn:
                await conn.execute(text("SELECT hold(1)"))

        task = asyncio.create_task(write())
        assert await asyncio.to_thread(entered.wait, 30)  # mid-statement, lock held
        assert not _writable(path)
        task.cancel()
        await asyncio.sleep(0.05)  # the cancel reaches the task while the statement runs
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert _writable(path)
        assert task.cancelled()  # still referenced here, as a stopped coordinator does
    finally:
        release.set()
        await db.dispose()
