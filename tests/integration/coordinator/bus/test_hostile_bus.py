"""A hostile bus, on SQLite and PostgreSQL: one bad node never costs the others their
writes, their health or their reachability; unknown-node floods cost bounded memory
and bounded work; a coordinator that falls behind takes it as its own outage; and the
coordinator will not start on an open bus unless told to."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import msgspec
import nats
import pytest

from coordinator.app import running_coordinator
from coordinator.domain.liveness import LivenessTracker
from coordinator.ledger import Ledger
from coordinator.services import node_ingest, node_watch
from coordinator.services.node_watch import NodeWatch
from ops.kit.keys import new_key
from procs.settings import ConfigError
from shared.clock import FakeClock
from shared.ids import new_pool_id
from shared.subjects import Subjects
from shared.wire import DeviceHealth, Heartbeat
from tests.connections import closed
from tests.factories import make_heartbeat, make_inventory, unchecked
from tests.fakes import RecordingAlerts, RecordingPublisher
from tests.integration.conftest import coordinator_settings
from tests.waiting import eventually


class Rig:
    def __init__(self, ledger: Ledger, pool_id: str) -> None:
        self.ledger, self.pool_id = ledger, pool_id
        self.clock = FakeClock(1_800_000_000_000)
        self.tracker = LivenessTracker(misses=3, recovery_hold_ms=1000)
        self.sink = RecordingAlerts()
        self.bus = RecordingPublisher()
        self.drops: list[tuple[str, str]] = []
        self.backlog = 0
        self.service = NodeWatch(
            ledger,
            self.tracker,
            Subjects("t"),
            self.clock,
            self.bus,
            self.sink,
            drop=lambda reason, subject: self.drops.append((reason, subject)),
            backlog=lambda: self.backlog,
            backlog_limit=100,
        )


@pytest.fixture
async def rig(ledger: Ledger) -> AsyncIterator[Rig]:
    await ledger.tenants.create("acme", "Acme", 1)
    pool_id = new_pool_id()
    await ledger.pools.create(pool_id, "p", "acme", None, 1)
    rig = Rig(ledger, pool_id)
    await rig.service.load()
    rig.tracker.bus_up(rig.clock.now_ms())
    yield rig


async def test_one_bad_inventory_never_aborts_the_batch_or_health_recording(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: the insert of an out-of-range vcpu failed and `write_pending` lost every
    other inventory and health transition of that pass. (Such a vcpu is now refused
    before the ledger as implausible; an out-of-range profile version still reaches it.)"""
    n0 = make_inventory("n0", rig.pool_id, gpus=1)
    rig.service.on_inventory(n0)
    await rig.service.write_pending()
    rig.service.on_heartbeat(make_heartbeat(n0, 1))
    await rig.service.write_pending()
    # One pass: a poisoned inventory (past the wire model, as a buggy build could send
    # it), a good one, and a device failure on n0.
    bad = unchecked(make_inventory("n2", rig.pool_id), profile_version=2**64)
    rig.service.on_inventory(bad)
    rig.service.on_inventory(make_inventory("n1", rig.pool_id))
    failing = DeviceHealth(device_id="GPU-n0-0", status="unhealthy", reasons=("xid 79",))
    rig.service.on_heartbeat(make_heartbeat(n0, 2, devices=(failing,)))
    await rig.service.write_pending()
    assert {"n0", "n1"} <= {r.node_id for r in await rig.ledger.nodes.liveness_snapshot()}
    assert "n2" not in {r.node_id for r in await rig.ledger.nodes.liveness_snapshot()}
    kinds = [e.kind for e in await rig.ledger.catalog.events("n0")]
    assert "device.unhealthy" in kinds
    assert rig.service.rejected == 1
    assert [r for r, subject in rig.drops if subject.endswith(".n2")] == ["ledger_rejected"]
    refused = [r for r in caplog.records if "refused" in r.getMessage()]
    assert [r.levelname for r in refused] == ["WARNING"]
    assert "node n2" in refused[0].getMessage()


async def test_a_flood_of_unknown_nodes_costs_bounded_memory_and_requests(rig: Rig) -> None:
    inv = make_inventory("proto", rig.pool_id)
    for i in range(20_000):
        forged = msgspec.structs.replace(make_heartbeat(inv, 1), node_id=f"forged-{i}")
        rig.service.on_heartbeat(forged)
    assert len(rig.service._unknown) <= node_ingest.MAX_UNKNOWN_PER_PASS
    for _ in range(5):
        await rig.service.write_pending()
    # Inventory requests are capped per second in all, not one per forged id.
    assert len(rig.bus.sent) <= node_watch.INVENTORY_REQUESTS_PER_S
    assert sum(1 for r, _ in rig.drops if r == "unknown_flood") >= 19_000
    # The table of recent requests is pruned once they are old.
    rig.clock.advance(node_watch.INVENTORY_REQUEST_EVERY_MS + 1)
    for i in range(node_ingest.MAX_UNKNOWN_PER_PASS):
        forged = msgspec.structs.replace(make_heartbeat(inv, 1), node_id=f"later-{i}")
        rig.service.on_heartbeat(forged)
    await rig.service.write_pending()
    assert len(rig.service._inv_requested) <= 2 * node_watch.INVENTORY_REQUESTS_PER_S
    assert len(rig.service._inv_requested) <= node_watch.MAX_REQUEST_TABLE


async def test_falling_behind_is_our_outage_not_the_nodes(rig: Rig) -> None:
    inv = make_inventory("n1", rig.pool_id, gpus=1)
    rig.service.on_inventory(inv)
    await rig.service.write_pending()
    rig.service.on_heartbeat(make_heartbeat(inv, 1, interval_ms=1000))
    rig.backlog = 10_000  # our queue holds unread messages: its heartbeats may be there
    rig.clock.advance(10_000)
    await rig.service.sweep()
    assert rig.tracker.nodes["n1"].reachable
    assert rig.service.behind_episodes == 1
    rig.backlog = 0  # caught up: the node gets its own window again, from now
    await rig.service.sweep()
    rig.clock.advance(2_000)
    await rig.service.sweep()
    assert rig.tracker.nodes["n1"].reachable
    rig.clock.advance(2_000)
    await rig.service.sweep()
    assert not rig.tracker.nodes["n1"].reachable  # silence after that is believed
    # A slow-consumer drop on our side re-arms every window just the same.
    rig.service.on_heartbeat(make_heartbeat(inv, 2, interval_ms=1000))
    rig.service.fell_behind()
    assert rig.service.behind_episodes == 2


async def test_drops_while_behind_rearm_once_at_the_next_sweep(rig: Rig) -> None:
    """A slow consumer reports every message it drops; the windows are re-armed once, by
    the sweep that would otherwise judge, from the sweep's own time."""
    inv = make_inventory("n1", rig.pool_id, gpus=1)
    rig.service.on_inventory(inv)
    await rig.service.write_pending()
    rig.service.on_heartbeat(make_heartbeat(inv, 1, interval_ms=1000))
    await rig.service.sweep()
    rig.clock.advance(10_000)  # silent past its 3 s window: a sweep now would mark it
    for _ in range(1000):
        rig.service.fell_behind()  # our drops, not its silence
    assert rig.service.behind_episodes == 1000
    await rig.service.sweep()
    assert rig.tracker.nodes["n1"].reachable
    rig.clock.advance(2_000)
    await rig.service.sweep()
    assert rig.tracker.nodes["n1"].reachable
    rig.clock.advance(2_000)
    await rig.service.sweep()
    assert not rig.tracker.nodes["n1"].reachable  # a whole window of silence since


async def test_the_coordinator_refuses_an_open_bus_unless_told(
    tmp_path: Path, nats_url: str
) -> None:
    settings = coordinator_settings(
        f"sqlite:///{tmp_path / 'ledger.db'}", nats_url, insecure_bus=False
    )
    with pytest.raises(ConfigError, match="insecure-bus"):
        async with running_coordinator(settings):
            pass


async def test_revoked_bootstrap_key_stays_revoked_across_restarts(
    database_url: str, nats_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    key = new_key()
    settings = coordinator_settings(database_url, nats_url, bootstrap_operator_key=key)
    key_id = key.split("_")[1]
    async with running_coordinator(settings) as c:
        assert await c.ledger.keys.authenticate(key) is not None
    assert f"registered a new bootstrap key {key_id}" in caplog.text
    # The same key id with another secret is not a rotation: refused, not overwritten.
    forged = f"gpf_{key_id}_{new_key().split('_', 2)[2]}"
    with pytest.raises(ConfigError, match="new key"):
        async with running_coordinator(
            coordinator_settings(database_url, nats_url, bootstrap_operator_key=forged)
        ):
            pass
    async with running_coordinator(settings) as c:
        assert await c.ledger.keys.authenticate(key) is not None
        assert await c.ledger.keys.revoke(key_id, None, 2)
    caplog.clear()
    async with running_coordinator(settings) as c:
        assert await c.ledger.keys.authenticate(key) is None
    # Said, not silent: the operator learns the setting no longer works.
    assert f"key {key_id} was revoked and stays revoked" in caplog.text


async def test_idle_and_slow_header_connections_are_closed(tmp_path: Path, nats_url: str) -> None:
    settings = coordinator_settings(
        f"sqlite:///{tmp_path / 'ledger.db'}", nats_url, http_idle_timeout_s=0.5
    )
    async with running_coordinator(settings) as c:
        for first in (b"", b"GET /healthz HTTP/1.1\r\nHost: x\r\n"):
            reader, writer = await asyncio.open_connection("127.0.0.1", c.http.port)
            try:
                writer.write(first)
                started = time.monotonic()
                answer = await asyncio.wait_for(reader.read(), timeout=5)
                assert time.monotonic() - started < 3
                assert not answer.startswith(b"HTTP/1.1 200"), answer
            finally:
                await closed(writer)


async def test_metrics_on_their_own_listener_and_token(tmp_path: Path, nats_url: str) -> None:
    settings = coordinator_settings(
        f"sqlite:///{tmp_path / 'ledger.db'}", nats_url, metrics_port=0, metrics_token="s3cret"
    )
    async with running_coordinator(settings) as c, aiohttp.ClientSession() as http:
        assert c.metrics_http is not None
        async with http.get(f"{c.url}/metrics") as resp:
            assert resp.status == 404  # not on the API port
        url = f"http://127.0.0.1:{c.metrics_http.port}/metrics"
        async with http.get(url) as resp:
            assert resp.status == 401
        async with http.get(url, headers={"Authorization": "Bearer s3cret"}) as resp:
            assert resp.status == 200
            assert "gpufleet_" in await resp.text()


async def test_a_flood_and_poison_on_the_bus_spare_every_other_node(
    tmp_path: Path, nats_url: str
) -> None:
    """Bounded: loopback, 3 honest nodes beating every 200 ms, about 2 s of one
    attacker sending ~40,000 messages (its own subject flooded, forged unknown ids,
    poison payloads) into a coordinator whose client holds at most 2,000 unread
    messages. Nobody honest is marked unreachable, their health keeps being recorded,
    the API keeps answering and the attacker is rate limited."""
    settings = coordinator_settings(
        f"sqlite:///{tmp_path / 'ledger.db'}",
        nats_url,
        nats_pending_msgs_limit=2000,
        ingest_backlog_limit=1000,
        misses=3,
    )
    async with running_coordinator(settings) as c, aiohttp.ClientSession() as http:
        key = c.settings.bootstrap_operator_key
        headers = {"Authorization": f"Bearer {key}"}
        base = f"{c.url}/api/compute"
        async with http.post(f"{base}/tenants/create", json={"tenantId": "acme"},
                             headers=headers) as resp:  # fmt: skip
            assert resp.status == 200
        async with http.post(
            f"{base}/pools/create", json={"tenantId": "acme", "name": "p"}, headers=headers
        ) as resp:
            pool = (await resp.json())["poolId"]
        s = Subjects(c.settings.nats.subject_prefix)
        honest = [make_inventory(f"ok-{i}", pool, gpus=1) for i in range(3)]
        agents = await nats.connect(nats_url)
        attacker = await nats.connect(nats_url, pending_size=64 * 1024 * 1024)
        stop = asyncio.Event()
        failing = DeviceHealth(device_id="GPU-ok-0-0", status="unhealthy", reasons=("xid",))
        broken = asyncio.Event()
        beating: asyncio.Task[None] | None = None

        async def beat() -> None:
            seq = 0
            while not stop.is_set():
                seq += 1
                for inv in honest:
                    devices = (failing,) if inv.node_id == "ok-0" and broken.is_set() else ()
                    hb = make_heartbeat(inv, seq, interval_ms=200, devices=devices)
                    await agents.publish(s.heartbeat(pool, inv.node_id), hb.to_json())
                await asyncio.sleep(0.2)

        try:
            for inv in honest:
                await agents.publish(s.inventory(pool, inv.node_id), inv.to_json())
            beating = asyncio.create_task(beat(), name="honest-agents")

            async def registered() -> bool:
                return all(
                    c.tracker.nodes.get(i.node_id) is not None
                    and c.tracker.nodes[i.node_id].inventory_hash == i.inventory_hash
                    for i in honest
                )

            await eventually(registered)
            await asyncio.sleep(1.0)
            victim = make_inventory("evil", pool, gpus=1)
            poison = [
                b"not json",
                b"[" * 5000,
                json.dumps({"nodeId": "evil", "seq": 2**64}).encode(),
                b'{"nodeId": "evil\\u0000", "bootId": "' + b"b" * 4000 + b'"}',
                b'{"a": 1, "a": 2}',
            ]
            started = time.monotonic()
            sent = 0
            broken.set()
            while time.monotonic() - started < 2.0 and sent < 40_000:
                # The attacker shares this event loop with the coordinator and the honest
                # agents (on its own host it would not): it yields every 100 messages, so
                # that on a loaded machine its run between yields stays well inside one
                # honest window (3 x 200 ms) instead of starving the honest beats.
                for k in range(100):
                    n = sent + k
                    if n % 3 == 0:
                        hb = make_heartbeat(victim, n + 1, interval_ms=200)
                        await attacker.publish(s.heartbeat(pool, "evil"), hb.to_json())
                    elif n % 3 == 1:
                        forged: Heartbeat = msgspec.structs.replace(
                            make_heartbeat(victim, 1), node_id=f"forged-{n}"
                        )
                        await attacker.publish(s.heartbeat(pool, f"forged-{n}"), forged.to_json())
                    else:
                        await attacker.publish(s.heartbeat(pool, "evil"), poison[n % 5])
                sent += 100
                await asyncio.sleep(0)
                # The API answers while the flood goes on.
                if sent % 8000 == 0:
                    t = time.monotonic()
                    async with http.get(f"{c.url}/healthz") as resp:
                        assert resp.status == 200
                    assert time.monotonic() - t < 2.0
            await attacker.flush()

            async def health_recorded() -> bool:
                return "device.unhealthy" in [e.kind for e in await c.ledger.catalog.events("ok-0")]

            await eventually(health_recorded, within_s=15)
            await asyncio.sleep(1.5)  # a few honest windows (3 × 200 ms) after the flood
            for inv in honest:
                assert c.tracker.nodes[inv.node_id].reachable, inv.node_id
                kinds = [e.kind for e in await c.ledger.catalog.events(inv.node_id)]
                assert "node.unreachable" not in kinds, (inv.node_id, kinds)
            assert c.ingest.dropped["rate_limited"] > 0
            assert len(c.nodes._inv_requested) <= node_watch.MAX_REQUEST_TABLE
        finally:
            stop.set()
            if beating is not None:
                beating.cancel()
                await asyncio.gather(beating, return_exceptions=True)
            await attacker.close()
            await agents.close()
