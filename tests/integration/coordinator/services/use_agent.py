"""The bus side of one simulated agent (`Agent`) and what the use tests share: the
set-up (`on_the_bus`: the operator's API session and a NATS connection to a running
coordinator), waiting for the coordinator's use passes (`use_passes`, `pass_after`) and
reading its metrics (`metrics`, `samples`), for the use tests here and in
tests/integration/coordinator/app."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, NamedTuple

import aiohttp
import nats
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from coordinator.app import Coordinator
from shared.subjects import Subjects
from shared.wire import Alert, DeviceUse, Inventory, ProcessUse, UseReport
from tests.factories import make_heartbeat, make_inventory
from tests.integration.conftest import Api
from tests.waiting import eventually

IDLE_AFTER_S = 10  # the `used` coordinator's idle_after_s (conftest.py)


class Bus(NamedTuple):
    """What a use test talks to the coordinator through."""

    nc: nats.NATS
    session: aiohttp.ClientSession
    api: Api
    key: str  # the operator's key


@asynccontextmanager
async def on_the_bus(c: Coordinator) -> AsyncIterator[Bus]:
    """The operator's API session and a NATS connection to `c`, both closed after."""
    key = c.settings.bootstrap_operator_key
    assert key is not None
    nc = await nats.connect(c.settings.nats.url)
    try:
        async with aiohttp.ClientSession() as session:
            yield Bus(nc, session, Api(session, c.url, key), key)
    finally:
        await nc.close()


async def book_gpus(api: Api, pool: str, count: int) -> dict[str, Any]:
    """Tenant acme's two-hour booking of `count` whole GPUs in `pool`: the answer."""
    body = {
        "tenantId": "acme", "poolId": pool, "devices": [{"class": "gpu", "count": count}],
        "duration": "2h", "idempotencyKey": "r",
    }  # fmt: skip
    answer: dict[str, Any] = await api.ok("reservations.create", body)
    return answer


class Agent:
    """One simulated agent's bus side: heartbeats with use deltas, full use reports."""

    def __init__(self, c: Coordinator, nc: nats.NATS, inv: Inventory) -> None:
        self.subjects = Subjects(c.settings.nats.subject_prefix)
        self.nc = nc
        self.inv = inv
        self.seq = 0
        self.version = 0
        self.alerts: list[Alert] = []
        self.requests = 0

    @classmethod
    async def registered(cls, c: Coordinator, nc: nats.NATS, api: Api, gpus: int) -> Agent:
        """Tenant acme, a pool, and node n1 with `gpus` GPUs in it: registered, beating."""
        await api.ok("tenants.create", {"tenantId": "acme"})
        pool = (await api.ok("pools.create", {"tenantId": "acme", "name": "a"}))["poolId"]
        inv = make_inventory("n1", pool, gpus=gpus)
        agent = cls(c, nc, inv)
        await nc.subscribe(agent.subjects.all_alerts, cb=agent.on_alert)
        await nc.publish(agent.subjects.inventory(pool, "n1"), inv.to_json())
        await agent.wait_for("node.registered")
        await agent.beat()
        return agent

    async def on_alert(self, msg: nats.aio.msg.Msg) -> None:
        self.alerts.append(Alert.from_json(msg.data))

    async def on_request(self, _: nats.aio.msg.Msg) -> None:
        self.requests += 1

    async def beat(self, **kw: object) -> None:
        self.seq += 1
        hb = make_heartbeat(self.inv, self.seq, **kw)  # type: ignore[arg-type]
        await self.nc.publish(self.subjects.heartbeat(hb.pool_id, hb.node_id), hb.to_json())
        await self.nc.flush()

    async def beat_same_use(self) -> None:
        """A heartbeat saying the node's use is still the version it last sent."""
        await self.beat(use_base=self.version, use_version=self.version)

    async def delta(self, *devices: DeviceUse, base: int | None = None) -> None:
        """A heartbeat carrying these devices' new use on top of `base` (ours by default)."""
        base = self.version if base is None else base
        self.version += 1
        await self.beat(use=devices, use_base=base, use_version=self.version)

    async def report(self, *devices: DeviceUse) -> None:
        self.version += 1
        report = UseReport(
            node_id=self.inv.node_id, pool_id=self.inv.pool_id, boot_id=self.inv.boot_id,
            sent_at=0, use_version=self.version, devices=devices,
        )  # fmt: skip
        await self.nc.publish(self.subjects.use(report.pool_id, report.node_id), report.to_json())
        await self.beat_same_use()

    async def wait_for(self, kind: str, count: int = 1) -> list[Alert]:
        async def arrived() -> bool:
            return sum(a.kind == kind for a in self.alerts) >= count

        await eventually(arrived, within_s=10)
        return [a for a in self.alerts if a.kind == kind]


def gpu(uuid: str, *owners: tuple[str, str], util: int = 80) -> DeviceUse:
    procs = tuple(
        ProcessUse(pid=100 + i, owner=o, owner_kind=k, used_memory_mib=1024)  # type: ignore[arg-type]
        for i, (o, k) in enumerate(owners)
    )
    return DeviceUse(device_id=uuid, sm_util=util if procs else 0, processes=procs)


def unit(reservation: dict[str, object]) -> str:
    atoms = reservation["atoms"]
    assert isinstance(atoms, list)
    return str(atoms[0]["atomId"]).split(":gpu:", 1)[1]


async def use_passes(c: Coordinator, n: int = 1, within_s: float = 10.0) -> None:
    """Wait until `c` has made `n` more use passes (as the leader: only it makes them)."""
    watch = c.gpu_use
    assert watch is not None
    seen, last = 0, watch.lines

    async def made() -> bool:
        nonlocal seen, last
        if watch.lines is not last:
            seen, last = seen + 1, watch.lines
        return seen >= n

    await eventually(made, within_s=within_s)


async def pass_after(c: Coordinator, agent: Agent) -> None:
    """Wait until `c` holds the agent's latest use, then for a use pass that saw it."""
    watch = c.gpu_use
    assert watch is not None

    async def held() -> bool:
        node = watch.book.nodes.get(agent.inv.node_id)
        return node is not None and node.version == agent.version

    await eventually(held)
    # Two passes: the first may have begun before the use arrived.
    await use_passes(c, 2)


async def metrics(c: Coordinator, session: aiohttp.ClientSession, key: str) -> str:
    """The coordinator's /metrics page as `key` reads it."""
    headers = {"Authorization": f"Bearer {key}"}
    async with session.get(f"{c.url}/metrics", headers=headers) as resp:
        assert resp.status == 200
        return await resp.text()


def samples(text: str) -> list[Sample]:
    """Every sample of a /metrics page."""
    return [s for family in text_string_to_metric_families(text) for s in family.samples]
