"""The publisher alone against a real nats-server: inventory on hash change, immediate
heartbeats on health change, `unmonitored` when polling stalls, a hung server of a
cluster left for another well inside one detection window, a busy link kept, and the
bookings etag said confirmed only for heartbeats the server answered."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TypeVar

import nats
import pytest
from nats.aio.msg import Msg

from agent.inventory import Identity, build_inventory
from agent.poller import Poller
from agent.publisher import Publisher
from agent.reader import NvmlReader
from agent.readings import HostReading, NvmlSnapshot
from agent.sim.faults import FaultFile, write_faults
from agent.sim.nvml import SimulatedNvml
from agent.sim.profile import load_profile
from agent.sim.sysfs_tree import FaultedPorts, build_tree
from agent.state import AgentState
from agent.sysfs import read_host
from ops.kit.embedded_nats import EmbeddedNats, EmbeddedNatsCluster
from procs.nats import NatsSettings
from shared.clock import SystemClock
from shared.ids import new_pool_id
from shared.subjects import Subjects
from shared.wire import DeviceHealth, Heartbeat, Inventory, NodeHealth
from tests.waiting import eventually

CLOCK = SystemClock()
HEALTHY = NodeHealth(status="healthy")


def state(pool: str, vcpu: int, health: NodeHealth = HEALTHY, age: float = 0.0) -> AgentState:
    inv = build_inventory(
        Identity(node_id="n1", pool_id=pool),
        NvmlSnapshot(),
        HostReading(vcpu=vcpu),
        boot_id="",
        sent_at=0,
    )
    devices = (
        () if health.status == "healthy" else (DeviceHealth(device_id="GPU-1", status="unhealthy"),)
    )
    return AgentState(inv, health, devices, CLOCK.monotonic() - age)


class Wire:
    def __init__(self) -> None:
        self.heartbeats: asyncio.Queue[Heartbeat] = asyncio.Queue()
        self.inventories: asyncio.Queue[Inventory] = asyncio.Queue()

    async def hb(self, msg: Msg) -> None:
        await self.heartbeats.put(Heartbeat.from_json(msg.data))

    async def inv(self, msg: Msg) -> None:
        await self.inventories.put(Inventory.from_json(msg.data))


@pytest.fixture
async def rig(nats_url: str) -> AsyncIterator[tuple[Publisher, Wire, str]]:
    pool = new_pool_id()
    subjects = Subjects(f"t{secrets.token_hex(4)}")
    nc = await nats.connect(nats_url)
    wire = Wire()
    await nc.subscribe(subjects.heartbeat(pool, "n1"), cb=wire.hb)
    await nc.subscribe(subjects.inventory(pool, "n1"), cb=wire.inv)
    await nc.flush()
    pub = Publisher(
        nats=NatsSettings(url=nats_url),
        subjects=subjects,
        pool_id=pool,
        node_id="n1",
        boot_id="boot-1",
        interval_s=0.3,
        clock=CLOCK,
    )
    task = asyncio.create_task(pub.run(), name="publisher")
    try:
        yield pub, wire, pool
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await nc.close()


T = TypeVar("T")


async def next_of(queue: asyncio.Queue[T]) -> T:
    return await asyncio.wait_for(queue.get(), 10)


async def test_inventory_resent_when_hash_changes(rig: tuple[Publisher, Wire, str]) -> None:
    pub, wire, pool = rig
    pub.update(state(pool, vcpu=8))
    first = await next_of(wire.inventories)
    await next_of(wire.heartbeats)
    pub.update(state(pool, vcpu=8))  # same content: no new inventory
    pub.update(state(pool, vcpu=16))
    second = await next_of(wire.inventories)
    assert first.scalars.vcpu == 8 and second.scalars.vcpu == 16
    assert first.inventory_hash != second.inventory_hash
    assert first.boot_id == second.boot_id == "boot-1"
    hb = await next_of(wire.heartbeats)
    while hb.inventory_hash != second.inventory_hash:
        hb = await next_of(wire.heartbeats)
    assert wire.inventories.empty()
    assert pub.stats.inventories == 2


async def test_health_change_is_sent_at_once(rig: tuple[Publisher, Wire, str]) -> None:
    pub, wire, pool = rig
    pub.update(state(pool, vcpu=8))
    await next_of(wire.heartbeats)
    sick = NodeHealth(status="degraded", reasons=("GPU-1: unhealthy: xid 79",))
    loop = asyncio.get_running_loop()
    sent = loop.time()
    pub.update(state(pool, vcpu=8, health=sick))
    hb = await next_of(wire.heartbeats)
    while hb.health.status == "healthy":
        hb = await next_of(wire.heartbeats)
    assert loop.time() - sent < 0.25  # sooner than the 0.3 s heartbeat timer
    assert [d.device_id for d in hb.devices] == ["GPU-1"]


async def test_stalled_polling_reports_unmonitored(rig: tuple[Publisher, Wire, str]) -> None:
    pub, wire, pool = rig
    pub.update(state(pool, vcpu=8, age=5.0))  # last poll 5 s ago, interval 0.3 s
    hb = await next_of(wire.heartbeats)
    assert hb.health.status == "unmonitored"
    assert "poll stalled" in hb.health.reasons[0]
    pub.update(state(pool, vcpu=8))
    hb = await next_of(wire.heartbeats)
    assert hb.health.status == "healthy"


async def test_missing_gpu_and_port_down_reach_the_bus(
    rig: tuple[Publisher, Wire, str], tmp_path: Path
) -> None:
    """Through the real reader, presence, health and publisher: a GPU NVML cannot open
    (NVML_ERROR_UNKNOWN) and an InfiniBand port down are on the wire as devices."""
    pub, wire, pool = rig
    prof = load_profile("h100-sxm-8")
    root = build_tree(tmp_path / "root", prof)
    faults = tmp_path / "faults.json"
    write_faults(
        faults,
        [
            {"kind": "handle_error", "gpu": 3, "error": "unknown"},
            {"kind": "port_down", "nic": "ibp0s0"},
        ],
    )
    poller = Poller(
        reader=NvmlReader(SimulatedNvml(prof, "n1", FaultFile(faults)), cpu_count=prof.vcpu),
        read_host=lambda: read_host(root),
        ident=Identity(node_id="n1", pool_id=pool),
        clock=CLOCK,
        boot_id="boot-1",
        read_ports=FaultedPorts(root, FaultFile(faults)),
    )
    pub.update(await asyncio.to_thread(poller.poll_once))
    inv = await next_of(wire.inventories)
    assert len(inv.gpus) == 8 and inv.gpus[3].missing is not None
    hb = await next_of(wire.heartbeats)
    assert hb.health.status == "degraded"
    assert {d.device_id: d.status for d in hb.devices} == {
        "0000:1a:00.0": "unhealthy",
        "missing-pci-0000:5d:00.0": "unhealthy",
    }


# The coordinator's window for this agent is misses x interval = 3 x 3 s = 9 s; the agent
# must be heard again through another server within a third of it.
HUNG_INTERVAL_S = 3.0
HUNG_BUDGET_S = 3 * HUNG_INTERVAL_S / 3


async def test_a_hung_server_is_left_for_another_within_a_third_of_the_window() -> None:
    cluster = EmbeddedNatsCluster(3)
    await asyncio.to_thread(cluster.start)
    pool = new_pool_id()
    subjects = Subjects(f"t{secrets.token_hex(4)}")
    pub = Publisher(
        nats=NatsSettings(url=cluster.url),
        subjects=subjects,
        pool_id=pool,
        node_id="n1",
        boot_id="boot-1",
        interval_s=HUNG_INTERVAL_S,
        clock=CLOCK,
    )
    task = asyncio.create_task(pub.run(), name="publisher")
    hung = None
    loop = asyncio.get_running_loop()
    try:
        pub.update(state(pool, vcpu=8))

        async def connected() -> bool:
            return pub.server != ""

        await eventually(connected)
        hung = cluster.servers[cluster.by_port(int(pub.server.rsplit(":", 1)[1]))]
        listener = next(s for s in cluster.servers.values() if s is not hung)
        nc = await nats.connect(servers=[listener.url], dont_randomize=True)
        arrivals: asyncio.Queue[tuple[float, Heartbeat]] = asyncio.Queue()
        seqs: list[int] = []

        async def on_hb(msg: Msg) -> None:
            hb = Heartbeat.from_json(msg.data)
            seqs.append(hb.seq)
            await arrivals.put((loop.time(), hb))

        await nc.subscribe(subjects.heartbeat(pool, "n1"), cb=on_hb)
        await nc.flush()
        try:
            # Heard through the cluster's route; right after one arrives the next is a
            # whole interval away, so the stop below catches no heartbeat in flight.
            await asyncio.wait_for(arrivals.get(), 20)
            hung.pause()
            stopped = loop.time()
            # Generous wait, so a slow agent fails on the bound below, not on a timeout.
            arrived, _ = await asyncio.wait_for(arrivals.get(), 9 * HUNG_BUDGET_S)
            assert arrived - stopped <= HUNG_BUDGET_S, arrived - stopped
            assert pub.server not in ("", f"127.0.0.1:{hung.port}")
            # Every heartbeat the publisher counts as sent (seq 0 .. heartbeats-1) from
            # the first this subscriber could hear reached it: none was lost with the
            # hung server.
            await asyncio.wait_for(arrivals.get(), 3 * HUNG_INTERVAL_S)
            sent = pub.stats.heartbeats

            async def caught_up() -> bool:
                return max(seqs) >= sent - 1

            await eventually(caught_up, within_s=3 * HUNG_INTERVAL_S)
            assert sorted(set(seqs)) == list(range(seqs[0], max(seqs) + 1))
        finally:
            await nc.close()
    finally:
        if hung is not None:
            hung.resume()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.to_thread(cluster.close)


async def test_the_bookings_etag_is_confirmed_only_by_heartbeats_the_server_answered(
    tmp_path: Path,
) -> None:
    # What keeps the bookings file fresh (agent.bookings_trust): a server that stops
    # answering stops the confirmations, and they resume with it.
    echoed: list[str] = []
    with EmbeddedNats(store_dir=str(tmp_path / "js")) as server:
        pool = new_pool_id()
        pub = Publisher(
            nats=NatsSettings(url=server.url),
            subjects=Subjects(f"t{secrets.token_hex(4)}"),
            pool_id=pool,
            node_id="n1",
            boot_id="boot-1",
            interval_s=0.3,
            clock=CLOCK,
            bookings_etag=lambda: "e1",
            bookings_echoed=echoed.append,
        )
        task = asyncio.create_task(pub.run(), name="publisher")
        try:
            pub.update(state(pool, vcpu=8))

            async def confirmed(n: int) -> bool:
                return len(echoed) >= n

            await eventually(lambda: confirmed(3))
            assert set(echoed) == {"e1"} and len(echoed) == pub.stats.heartbeats
            server.pause()
            try:
                at_pause = len(echoed)
                await asyncio.sleep(2.0)  # six intervals
                assert len(echoed) <= at_pause + 1  # one answered just before, at most
            finally:
                server.resume()
            await eventually(lambda: confirmed(at_pause + 3), within_s=20)
            # One each, and none for a heartbeat sent into the hung link (sent again after).
            assert len(echoed) == pub.stats.heartbeats
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def test_a_busy_link_is_kept_and_reads_on_after_its_late_answer(nats_url: str) -> None:
    """The agent probes its link as every gpufleet process does (`procs.nats_link`): on
    a starved host the PONG queues behind what the server holds for the agent (here
    20,000 bookings messages); a probe answered late while messages keep arriving is a
    busy link, not a dead one: no reconnect (which would drop what the server holds),
    every message handled, and the late PONG leaves the link reading what comes next
    (nats-py 2.16 stops its read loop for a PONG that comes after a flush timed out)."""
    pool = new_pool_id()
    subjects = Subjects(f"t{secrets.token_hex(4)}")
    handled = [0]
    pub = Publisher(
        nats=NatsSettings(url=nats_url), subjects=subjects, pool_id=pool, node_id="n1",
        boot_id="boot-1", interval_s=0.3, clock=CLOCK,
        on_bookings=lambda _: handled.__setitem__(0, handled[0] + 1),
    )  # fmt: skip
    task = asyncio.create_task(pub.run(), name="publisher")
    sender = await nats.connect(nats_url)
    loop = asyncio.get_running_loop()
    try:
        pub.update(state(pool, vcpu=8))

        async def heard() -> bool:
            return pub.stats.heartbeats >= 2

        await eventually(heard)
        count, payload = 20_000, b"x" * 300
        for _ in range(count):
            await sender.publish(subjects.bookings(pool, "n1"), payload)
        await sender.flush()
        # Each turn of the event loop costs 50 ms: the socket is read slowly, for a few
        # probe timeouts (0.5 s each at this interval).
        until = loop.time() + 3.0
        while loop.time() < until:
            time.sleep(0.05)  # noqa: ASYNC251 - blocking is the point: a starved loop
            await asyncio.sleep(0)
        assert (pub.stats.reconnects, pub.stats.dead_links) == (0, 0)
        assert pub.stats.late_probes >= 1

        async def all_handled() -> bool:
            return handled[0] == count

        await eventually(all_handled, within_s=30)
        for _ in range(1000):
            await sender.publish(subjects.bookings(pool, "n1"), payload)
        await sender.flush()
        count += 1000
        await eventually(all_handled, within_s=10)
        beats = pub.stats.heartbeats

        async def beating() -> bool:
            return pub.stats.heartbeats >= beats + 3

        await eventually(beating, within_s=10)
        assert (pub.stats.reconnects, pub.stats.dead_links) == (0, 0)
    finally:
        await sender.close()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
