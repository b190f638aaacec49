"""Fenced leadership on PostgreSQL: a leader whose lock session is gone writes nothing
more; a new leader's takeover waits for the old one's write in flight, so two leaders
never write at once; with two coordinator replicas, terminating the leader's backends
hands the lead to the other within a detection window, the API answers 503 (never 500)
while connections are dropped, and every booking it acknowledged survives."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import aiohttp
import pytest
from sqlalchemy import select

from coordinator.app import running_coordinator
from coordinator.domain.liveness import LivenessTracker
from coordinator.domain.transitions import DuplicateIdSeen
from coordinator.ledger import Ledger, LedgerUnavailable, NotLeader, schema
from coordinator.services.node_records import record_inventory, record_maintenance
from coordinator.services.node_watch import NodeWatch
from ops.kit.embedded_nats import free_port
from shared.clock import FakeClock
from shared.ids import new_pool_id
from shared.subjects import Subjects
from shared.wire import DeviceHealth
from tests.conftest import _pg_execute
from tests.database import database
from tests.factories import make_heartbeat, make_inventory
from tests.fakes import RecordingAlerts, RecordingPublisher
from tests.integration.conftest import Api, coordinator_settings
from tests.rig import Rig
from tests.waiting import eventually


@pytest.fixture
def pg_url(database_url: str) -> str:
    if not database_url.startswith("postgresql"):
        pytest.skip("leadership is a PostgreSQL advisory lock")
    return database_url


@pytest.fixture
async def two_ledgers(pg_url: str) -> AsyncIterator[tuple[Ledger, Ledger]]:
    a = await Ledger.open(pg_url, application_name="gpufleet-test a")
    b = await Ledger.open(pg_url, application_name="gpufleet-test b")
    try:
        yield a, b
    finally:
        await a.close()
        await b.close()


async def _events(url: str, node_id: str) -> list[str]:
    e = schema.node_events.c
    async with database(url) as db, db.read() as conn:
        rows = await conn.execute(select(e.kind).where(e.node_id == node_id).order_by(e.event_id))
        return [r[0] for r in rows.all()]


async def _kill_backend(pid: int) -> None:
    # pg_terminate_backend only signals; with a timeout it waits until the backend (and
    # its advisory lock) is gone, so the next fence check cannot still see it (a loaded
    # machine once ran the check first: "DID NOT RAISE NotLeader").
    await _pg_execute(f"SELECT pg_terminate_backend({pid}, 10000)")


async def _term(url: str) -> tuple[int, str]:
    t = schema.leader_term.c
    async with database(url) as db, db.read() as conn:
        row = (await conn.execute(select(t.epoch, t.holder))).one()
        return int(row[0]), str(row[1])


async def test_a_leader_whose_lock_session_died_writes_nothing(
    pg_url: str, two_ledgers: tuple[Ledger, Ledger]
) -> None:
    ledger_a, ledger_b = two_ledgers
    a, b = ledger_a.leadership("a"), ledger_b.leadership("b")
    await a.tick(1)
    await b.tick(1)
    assert (a.is_leader, b.is_leader, a.epoch) == (True, False, 1)
    rig = await Rig.open(ledger_a)
    pool = await rig.pool(nodes=1)
    node = f"{pool[-6:]}-n0"
    with a.fenced():
        await record_maintenance(ledger_a, node, True, "while leading", "ops", 2)
    token = a.token()
    assert token is not None

    await _kill_backend(token.pid)
    # Before anyone else leads: refused at the next write, which steps it down.
    with a.fenced(), pytest.raises(NotLeader, match="session is gone"):
        await record_maintenance(ledger_a, node, False, "after the lock", "ops", 3)
    assert not a.is_leader and a.fenced_refusals == 1

    await b.tick(4)
    await a.tick(4)
    assert (a.is_leader, b.is_leader, b.epoch) == (False, True, 2)
    with a.fenced(), pytest.raises(NotLeader):
        await record_maintenance(ledger_a, node, False, "after the takeover", "ops", 5)
    with b.fenced():
        await ledger_b.rebuild_all(6)
    assert await _events(pg_url, node) == ["node.registered", "node.maintenance"]
    assert await _term(pg_url) == (2, "b")
    # Outside a leader loop (the API's writes) nothing is fenced.
    await record_maintenance(ledger_a, node, False, "through the API", "ops", 7)
    await a.close()
    await b.close()


async def test_a_takeover_waits_for_the_old_leaders_write_in_flight(
    pg_url: str, two_ledgers: tuple[Ledger, Ledger]
) -> None:
    ledger_a, ledger_b = two_ledgers
    a, b = ledger_a.leadership("a"), ledger_b.leadership("b")
    await a.tick(1)
    rig = await Rig.open(ledger_a)
    pool = await rig.pool(nodes=1)
    node = f"{pool[-6:]}-n0"
    token = a.token()
    assert token is not None
    entered, release = asyncio.Event(), asyncio.Event()

    async def slow_leader_write() -> None:
        with a.fenced():
            async with ledger_a.nodes.change([node], 2) as change:
                entered.set()
                await release.wait()
                await change.save(node, change.before[node], (DuplicateIdSeen("b1", "b2"),))

    writer = asyncio.create_task(slow_leader_write())
    await entered.wait()
    await _kill_backend(token.pid)

    taker = asyncio.create_task(b.tick(3))
    await asyncio.sleep(1.0)
    # The lock is free, but the term cannot move while the old write is in flight.
    assert not taker.done() and not b.is_leader
    release.set()
    await asyncio.gather(writer, taker)
    # The write that began under the old term committed, then the new term began.
    assert await _events(pg_url, node) == ["node.registered", "node.duplicateId"]
    assert b.is_leader and b.epoch == 2
    await a.close()
    await b.close()


async def test_terminating_the_leaders_backends_hands_over_and_loses_no_booking(
    pg_url: str, nats_url: str
) -> None:
    settings = coordinator_settings(pg_url, nats_url)
    key = settings.bootstrap_operator_key
    assert key
    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(running_coordinator(settings))
        b = await stack.enter_async_context(running_coordinator(settings))
        assert (a.leadership.is_leader, b.leadership.is_leader) == (True, False)
        session = await stack.enter_async_context(aiohttp.ClientSession())
        api_a, api_b = Api(session, a.url, key), Api(session, b.url, key)
        await api_a.ok("tenants.create", {"tenantId": "acme"})
        pool = (await api_a.ok("pools.create", {"tenantId": "acme", "name": "p"}))["poolId"]
        # Room for all nine bookings: any refusal would be the failover's, not capacity's.
        await record_inventory(a.ledger, make_inventory("n1", pool, gpus=16), 1)
        body = {
            "tenantId": "acme", "poolId": pool, "devices": [{"class": "gpu", "count": 1}],
            "duration": "1h",
        }  # fmt: skip
        acknowledged: list[str] = []
        statuses: list[int] = []

        async def book(api: Api, k: int) -> None:
            status, out = await api.call("reservations.create", body | {"idempotencyKey": f"k{k}"})
            statuses.append(status)
            if status == 200:
                acknowledged.append(out["reservationId"])

        for k in range(3):
            await book(api_a if k % 2 else api_b, k)
        epoch_before = (await _term(pg_url))[0]

        name = f"gpufleet-coordinator {a.replica}"
        terminated = asyncio.create_task(
            _pg_execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                f"WHERE application_name = '{name}'"
            )
        )
        # Bookings through the old leader while its connections are dropped.
        await asyncio.gather(terminated, *(book(api_a, k) for k in range(3, 6)))

        async def handed_over() -> bool:
            return b.leadership.is_leader and not a.leadership.is_leader

        # Within one detection window (misses x a 1 s heartbeat): the follower tries the
        # lock every second, and the terminated session released it at once.
        await eventually(handed_over, within_s=settings.misses * 1.0)
        for k in range(6, 9):
            await book(api_a if k % 2 else api_b, k)

        epoch, holder = await _term(pg_url)
        assert (epoch, holder) == (epoch_before + 1, b.replica)
        assert set(statuses) <= {200, 503}, statuses
        async with database(pg_url) as db, db.read() as conn:
            r = schema.reservations.c
            stored = (await conn.execute(select(r.reservation_id))).scalars().all()
        # Every acknowledged booking is there, and nothing that was not acknowledged.
        assert sorted(stored) == sorted(acknowledged) and len(acknowledged) >= 6
        await asyncio.sleep(1.5)
        # The old replica stays a follower; its leader loops write nothing.
        assert not a.leadership.is_leader and await _term(pg_url) == (epoch, holder)


async def test_a_url_with_several_hosts_finds_the_primary_past_a_dead_one(pg_url: str) -> None:
    base, dbname = pg_url.rsplit("/", 1)
    host = base.split("@", 1)[1]
    dead = f"127.0.0.1:{free_port()}"
    ledger = await Ledger.open(f"postgresql://postgres@{dead},{host}/{dbname}")
    try:
        assert await ledger.pools.list_all() == []
    finally:
        await ledger.close()


async def test_a_health_change_taken_while_the_database_was_away_is_written_after(
    pg_url: str,
) -> None:
    """The database drops every connection and refuses new ones while a device turns
    unhealthy: the write fails as LedgerUnavailable (503 on the API, a warning in the
    loops), the change is kept, and it is recorded once the database is back."""
    dbname = pg_url.rsplit("/", 1)[1]
    ledger = await Ledger.open(pg_url)
    try:
        await ledger.tenants.create("acme", "Acme", 1)
        pool = new_pool_id()
        await ledger.pools.create(pool, "p", "acme", None, 1)
        clock = FakeClock(1_800_000_000_000)
        tracker = LivenessTracker(misses=3, recovery_hold_ms=1000)
        sink = RecordingAlerts()
        nodes = NodeWatch(
            ledger, tracker, Subjects("t"), clock, RecordingPublisher(), sink,
            drop=lambda reason, subject: None,
        )  # fmt: skip
        await nodes.load()
        tracker.bus_up(clock.now_ms())
        inv = make_inventory("n1", pool, gpus=2)
        nodes.on_inventory(inv)
        await nodes.write_pending()

        await _pg_execute(f"ALTER DATABASE {dbname} ALLOW_CONNECTIONS false")
        await _pg_execute(
            f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{dbname}'"
        )
        sick = (DeviceHealth(device_id="GPU-n1-1", status="unhealthy"),)
        nodes.on_heartbeat(make_heartbeat(inv, 1, devices=sick))
        with pytest.raises(LedgerUnavailable):
            await nodes.write_pending()
        await _pg_execute(f"ALTER DATABASE {dbname} ALLOW_CONNECTIONS true")
        nodes.on_heartbeat(make_heartbeat(inv, 2, devices=sick))  # no change: not dirty
        await nodes.write_pending()
        assert [a.kind for a in sink.alerts] == ["node.registered", "device.unhealthy"]
        assert await _events(pg_url, "n1") == ["node.registered", "device.unhealthy"]
    finally:
        await _pg_execute(f"ALTER DATABASE {dbname} ALLOW_CONNECTIONS true")
        await ledger.close()
