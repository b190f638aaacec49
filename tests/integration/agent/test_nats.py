"""The agent against a real nats-server: inventory, heartbeats, inventory requests,
signals, a server restart, and a start before the server is up."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from agent.config import HealthSettings, Settings
from agent.inventory import Identity, build_inventory
from agent.main import run
from agent.poller import Poller
from agent.publisher import Publisher
from agent.reader import NvmlReader
from agent.readings import HostReading, NvmlSnapshot
from agent.sim.faults import write_faults
from agent.sim.nvml import SimulatedNvml
from agent.sim.profile import load_profile
from agent.sim.sysfs_tree import build_tree
from agent.state import AgentState
from agent.sysfs import read_host
from ops.kit.embedded_nats import EmbeddedNats, free_port
from ops.kit.nats_server_config import credentials_text, render_authorization
from ops.kit.nats_users import AgentNode, NatsUser, Permissions, agent_permissions, agent_user
from procs.nats import NatsSettings
from shared.clock import SystemClock
from shared.ids import new_pool_id
from shared.subjects import Subjects
from shared.wire import Heartbeat, Inventory, NodeHealth
from tests.waiting import eventually

PREFIX = "tauth"


def state(pool: str, node: str) -> AgentState:
    inv = build_inventory(
        Identity(node_id=node, pool_id=pool),
        NvmlSnapshot(),
        HostReading(vcpu=8),
        boot_id="",
        sent_at=0,
    )
    return AgentState(inv, NodeHealth(status="healthy"), (), SystemClock().monotonic())


class Bus:
    """Everything one agent publishes, parsed, in arrival order."""

    def __init__(self, nc: Client, subjects: Subjects, pool: str, node: str) -> None:
        self.nc = nc
        self.subjects = subjects
        self.pool = pool
        self.node = node
        self.heartbeats: asyncio.Queue[Heartbeat] = asyncio.Queue()
        self.inventories: asyncio.Queue[Inventory] = asyncio.Queue()

    async def start(self) -> None:
        await self.nc.subscribe(self.subjects.heartbeat(self.pool, self.node), cb=self._hb)
        await self.nc.subscribe(self.subjects.inventory(self.pool, self.node), cb=self._inv)
        await self.nc.flush()

    async def _hb(self, msg: Msg) -> None:
        await self.heartbeats.put(Heartbeat.from_json(msg.data))

    async def _inv(self, msg: Msg) -> None:
        await self.inventories.put(Inventory.from_json(msg.data))

    async def heartbeat(self, wait: float = 10) -> Heartbeat:
        return await asyncio.wait_for(self.heartbeats.get(), wait)

    async def inventory(self, wait: float = 10) -> Inventory:
        return await asyncio.wait_for(self.inventories.get(), wait)


def settings(nats_url: str, **kw: object) -> Settings:
    values: dict[str, object] = {
        "pool_id": new_pool_id(),
        "node_id": f"node-{secrets.token_hex(3)}.rack1",
        "nats": NatsSettings(url=nats_url, subject_prefix=f"t{secrets.token_hex(4)}"),
        "interval_s": 0.2,
        "simulate": "h100-sxm-8",
    }
    values.update(kw)
    return Settings(**values)  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def agent(s: Settings) -> AsyncIterator[asyncio.Task[int]]:
    stop = asyncio.Event()
    task = asyncio.create_task(run(s, stop=stop, install_signals=False), name="test-agent")
    try:
        yield task
    finally:
        stop.set()
        assert await asyncio.wait_for(task, 10) == 0


@contextlib.asynccontextmanager
async def bus_for(nats_url: str, s: Settings) -> AsyncIterator[Bus]:
    nc = await nats.connect(nats_url, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    try:
        bus = Bus(nc, Subjects(s.nats.subject_prefix), s.pool_id, s.node_id)
        await bus.start()
        yield bus
    finally:
        await nc.close()


async def test_inventory_then_heartbeats(nats_url: str) -> None:
    s = settings(nats_url)
    async with bus_for(nats_url, s) as bus, agent(s):
        inv = await bus.inventory()
        first = await bus.heartbeat()
        second = await bus.heartbeat()
    assert inv.node_id == s.node_id and inv.pool_id == s.pool_id
    assert inv.profile_id == "h100-sxm-8"
    counts: dict[str, int] = {}
    for atom in inv.atoms:
        counts[atom.cls] = counts.get(atom.cls, 0) + 1
    # 8 GPUs, 8 CX-7 x 4 VFs, 8 data disks, the node; the management NIC (eno1) and the
    # boot disk (sda) are listed but not bookable.
    assert counts == {"node": 1, "gpu": 8, "nic.vf": 32, "disk": 8}
    assert len({a.atom_id for a in inv.atoms}) == len(inv.atoms)
    assert inv.scalars.vcpu == 224 and inv.scalars.memory_gib == 2048
    assert inv.scalars.hugepages_1gi == 512
    assert {g.nvlink_clique for g in inv.gpus} == {"nvl0"}
    assert first.boot_id == second.boot_id == inv.boot_id
    assert second.seq == first.seq + 1
    assert first.inventory_hash == inv.inventory_hash
    assert first.interval_ms == 200
    assert first.health.status == "healthy" and first.devices == ()
    assert len(first.to_json()) < 1024


async def test_answers_inventory_request_with_and_without_reply(nats_url: str) -> None:
    s = settings(nats_url)
    async with bus_for(nats_url, s) as bus, agent(s):
        first = await bus.inventory()
        await bus.heartbeat()
        subject = bus.subjects.inventory_request(s.pool_id, s.node_id)
        reply = await bus.nc.request(subject, b"{}", timeout=5)
        answered = Inventory.from_json(reply.data)
        again = await bus.inventory()  # the request also re-publishes on the inventory subject
        await bus.nc.publish(subject, b"")
        third = await bus.inventory()
    assert answered.inventory_hash == first.inventory_hash == again.inventory_hash
    assert third.inventory_hash == first.inventory_hash
    assert third.sent_at >= first.sent_at


async def test_fault_file_moves_health_and_recovers(nats_url: str, tmp_path: Path) -> None:
    faults = tmp_path / "faults.json"
    s = settings(
        nats_url,
        fault_file=faults,
        health=HealthSettings(recover_after_s=0.5, xid_hold_s=0.2),
    )
    async with bus_for(nats_url, s) as bus, agent(s):
        inv = await bus.inventory()
        gpu3 = next(g.uuid for g in inv.gpus if g.index == 3)
        write_faults(
            faults, [{"kind": "xid", "gpu": 3, "xid": 79}, {"kind": "xid", "gpu": 2, "xid": 13}]
        )
        hb = await bus.heartbeat()
        while not hb.devices:
            hb = await bus.heartbeat()
        assert [d.device_id for d in hb.devices] == [gpu3]  # xid 13 is an application error
        assert hb.devices[0].status == "unhealthy"
        assert "xid 79" in hb.devices[0].reasons[0]
        assert hb.health.status == "degraded"
        # XID 79 needs a reset: it holds well past xid_hold_s + recover_after_s ...
        write_faults(faults, [])
        loop = asyncio.get_running_loop()
        until = loop.time() + 1.5
        while loop.time() < until:
            hb = await bus.heartbeat()
            assert [d.device_id for d in hb.devices] == [gpu3]
        # ... and clears once the GPU is reset (NVML's recovery action reads NONE again).
        write_faults(faults, [{"kind": "reset", "gpu": 3}])
        while hb.devices:
            hb = await bus.heartbeat()
        assert hb.health.status == "healthy"


async def test_heartbeats_resume_after_nats_restart(tmp_path: Path) -> None:
    with EmbeddedNats() as server:
        s = settings(server.url)
        async with bus_for(server.url, s) as bus, agent(s):
            await bus.inventory()
            before = await bus.heartbeat()
            await asyncio.to_thread(server.restart, 1.0)
            inv = await bus.inventory(wait=20)  # re-sent after the reconnect
            after = await bus.heartbeat(wait=20)
        assert after.boot_id == before.boot_id
        assert after.seq > before.seq
        assert inv.inventory_hash == before.inventory_hash


async def test_agent_started_before_nats_connects_when_it_comes_up() -> None:
    server = EmbeddedNats(port=free_port())
    try:
        s = settings(server.url)
        async with agent(s) as task:
            await asyncio.sleep(1.0)  # polling while no server listens
            assert not task.done()
            await asyncio.to_thread(server.start)
            async with bus_for(server.url, s) as bus:
                hb = await bus.heartbeat(wait=20)
        assert hb.node_id == s.node_id
    finally:
        server.close()


async def test_subprocess_sigterm_exits_zero(nats_url: str) -> None:
    s = settings(nats_url)
    cmd = [sys.executable, "-m", "agent.main", "--pool-id", s.pool_id, "--node-id", s.node_id]
    cmd += ["--nats-url", nats_url, "--subject-prefix", s.nats.subject_prefix]
    cmd += ["--simulate", "l40s-pcie-4", "--interval", "0.2", "--label", "rack=r1"]
    async with bus_for(nats_url, s) as bus:
        proc = await asyncio.create_subprocess_exec(
            *cmd, stderr=asyncio.subprocess.PIPE, env={**os.environ, "GPUFLEET_LOG_LEVEL": "INFO"}
        )
        try:
            inv = await bus.inventory(wait=30)
            await bus.heartbeat()
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = await asyncio.wait_for(proc.communicate(), 15)
    assert proc.returncode == 0, err.decode()
    assert inv.labels["rack"] == "r1"
    assert [a.cls for a in inv.atoms].count("gpu") == 4
    assert all(g.nvlink_clique is None for g in inv.gpus)
    assert b"agent stopped" in err


@pytest.mark.parametrize("argv", [["--node-id", "n1"], ["--pool-id", "pool_x"]])
async def test_bad_config_exits_two_naming_the_field(argv: list[str]) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agent.main",
        *argv,
        stderr=asyncio.subprocess.PIPE,
        env={k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")},
    )
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2
    assert b"pool_id" in err


async def test_polling_continues_while_nats_is_away(tmp_path: Path) -> None:
    prof = load_profile("l40s-pcie-4")
    root = build_tree(tmp_path, prof)
    clock = SystemClock()
    pool = new_pool_id()
    poller = Poller(
        reader=NvmlReader(SimulatedNvml(prof, "n1")),
        read_host=lambda: read_host(root),
        ident=Identity(node_id="n1", pool_id=pool),
        clock=clock,
        boot_id="b",
    )
    publisher = Publisher(
        nats=NatsSettings(url=f"nats://127.0.0.1:{free_port()}"),
        subjects=Subjects("t"),
        pool_id=pool,
        node_id="n1",
        boot_id="b",
        interval_s=0.05,
        clock=clock,
        timeout_s=1,
    )
    tasks = [
        asyncio.create_task(publisher.run(), name="pub"),
        asyncio.create_task(poller.run(0.05, publisher.update), name="poll"),
    ]
    try:
        await asyncio.sleep(1.0)
        assert poller.polls >= 8
        assert not publisher.connected
        assert publisher.stats.heartbeats == 0
        latest = publisher.latest
        assert latest is not None and clock.monotonic() - latest.polled_at < 0.5
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


WATCHER = "watcher"


@contextlib.contextmanager
def nats_with_users(tmp_path: Path, agent: NatsUser) -> Iterator[EmbeddedNats]:
    """A nats-server whose users are `agent` (password "agent-pw") and a watcher that may
    read everything."""
    watcher = NatsUser(WATCHER, "reader", Permissions(publish=(">",), subscribe=(">",)))
    config = tmp_path / "nats-server.conf"
    config.write_text(
        render_authorization([agent, watcher], {agent.name: "agent-pw", WATCHER: "watcher-pw"})
    )
    (tmp_path / "agent.creds").write_text(credentials_text(agent.name, "agent-pw"))
    with EmbeddedNats(config_file=str(config)) as server:
        yield server


def publisher_for(server: EmbeddedNats, creds: Path, pool: str, node: str) -> Publisher:
    return Publisher(
        nats=NatsSettings(url=server.url, credentials=str(creds)),
        subjects=Subjects(PREFIX),
        pool_id=pool,
        node_id=node,
        boot_id="boot-1",
        interval_s=0.2,
        clock=SystemClock(),
    )


async def test_refused_publishes_are_warned_once_per_period_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An agent started with another node's credentials (what `gpufleet nats-auth` wrote
    for gpu-a, on gpu-b): the server refuses everything it sends. No heartbeat can say so;
    the agent's log does, at WARNING, without flooding it."""
    pool = new_pool_id()
    owner = AgentNode(pool, "gpu-a")
    user = NatsUser(agent_user(owner), "agent", agent_permissions(Subjects(PREFIX), owner), owner)
    with nats_with_users(tmp_path, user) as server:
        pub = publisher_for(server, tmp_path / "agent.creds", pool, "gpu-b")
        pub.update(state(pool, "gpu-b"))
        caplog.set_level(logging.WARNING, logger="agent.publisher")
        task = asyncio.create_task(pub.run(), name="publisher")
        try:

            async def refused_often() -> bool:
                return pub.stats.errors.get("permissions", 0) >= 5

            await eventually(refused_often)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    refusals = [m for m in warnings if "permissions violation" in m.lower()]
    assert len(refusals) == 1, warnings  # one per 10 s, however many were refused
    assert "gpu-b" in refusals[0]  # the server names the subject it refused
    assert pub.stats.bus_errors >= 5


async def test_a_refused_subscription_is_counted_in_the_heartbeats_that_get_through(
    tmp_path: Path,
) -> None:
    """Heartbeats and inventory may be published but inventory requests may not be
    received (a server config of one's own that forgot the agent's subscribe grant): the
    coordinator's requests would go unanswered, and the heartbeats say why."""
    pool = new_pool_id()
    node = AgentNode(pool, "gpu-a")
    subjects = Subjects(PREFIX)
    allowed = Permissions(
        publish=(subjects.heartbeat(pool, "gpu-a"), subjects.inventory(pool, "gpu-a")),
        subscribe=(f"{PREFIX}.nothing",),
    )
    with nats_with_users(tmp_path, NatsUser(agent_user(node), "agent", allowed, node)) as server:
        nc = await nats.connect(server.url, user=WATCHER, password="watcher-pw")
        try:
            bus = Bus(nc, subjects, pool, "gpu-a")
            await bus.start()
            pub = publisher_for(server, tmp_path / "agent.creds", pool, "gpu-a")
            pub.update(state(pool, "gpu-a"))
            task = asyncio.create_task(pub.run(), name="publisher")
            try:

                async def counted() -> Heartbeat:
                    hb = await bus.heartbeat()
                    while hb.bus_errors == 0:
                        hb = await bus.heartbeat()
                    return hb

                hb = await asyncio.wait_for(counted(), 10)
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        finally:
            await nc.close()
    assert hb.bus_errors >= 1
    assert pub.stats.errors.get("permissions", 0) >= 1
