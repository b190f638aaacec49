"""Use data bounded by the inventory, and use alerts by a rate (issue 32), end to end on
a real nats-server and a real ledger (SQLite and PostgreSQL): the issue's reproductions
in small.

- One host invents devices: a use report with 3,000 made-up GPUs and heartbeats with
  32 each make no ledger row, no alert, no node event and no metric series; each such
  message is counted as an `unknown_device` drop, and the real GPU beside them is
  judged as before.
- A job spawns short-lived processes naming made-up reservations (8 rewrites of 250):
  a bounded handful of `gpu.foreignUse`, the held ones said as one that counts them,
  and the unhealthy device stays in the console's feed.
"""

from __future__ import annotations

import asyncio
import random
import string
from typing import Any

import aiohttp

from coordinator.app import Coordinator
from coordinator.domain.gpu_use_owners import MAX_OWNERS_PER_UNIT
from coordinator.domain.gpu_use_units import Policy
from shared.clock import FakeClock
from shared.ids import new_reservation_id
from shared.wire import DeviceHealth, DeviceUse, ProcessUse
from tests.integration.coordinator.services.use_agent import (
    Agent,
    book_gpus,
    gpu,
    metrics,
    on_the_bus,
    pass_after,
    samples,
    unit,
)
from tests.waiting import eventually


def _fake(i: int) -> DeviceUse:
    return DeviceUse(device_id=f"GPU-fake-{i}", processes=(ProcessUse(pid=i),))


async def test_a_host_cannot_invent_devices(used: Coordinator, clock: FakeClock) -> None:
    async with on_the_bus(used) as (nc, session, api, key):
        agent = await Agent.registered(used, nc, api, gpus=2)
        real = "GPU-n1-0"
        # One valid report: a pod on a real GPU, and 3,000 GPUs the node does not have.
        await agent.report(gpu(real, ("pod-7", "pod")), *(_fake(i) for i in range(3000)))
        (unbooked,) = await agent.wait_for("gpu.unbookedUse")
        assert unbooked.device_id == real
        # Heartbeats, each with 32 made-up GPUs (under the 8 KiB limit) as a delta.
        for k in range(20):
            clock.advance(500)
            await agent.delta(*(_fake(3000 + 32 * k + j) for j in range(32)))

        async def counted() -> bool:
            return used.ingest.dropped["unknown_device"] == 21

        await eventually(counted)
        await pass_after(used, agent)
        clock.advance(2000)
        await agent.beat_same_use()
        await pass_after(used, agent)

        assert used.gpu_use is not None
        assert set(used.gpu_use.book.nodes["n1"].devices) == {real}
        assert [a.kind for a in agent.alerts if a.kind.startswith("gpu.")] == ["gpu.unbookedUse"]
        events = await used.ledger.catalog.events("n1")
        assert [(e.kind, e.device_id) for e in events if e.kind.startswith("gpu.")] == [
            ("gpu.unbookedUse", real)
        ]
        # The real GPU's unbooked use is accounted, nothing else: one bucket.
        buckets = await used.ledger.gpu_use.buckets(0, clock.now_ms() + 1)
        assert len(buckets) == 1 and buckets[0].used_ms > 0
        text = await metrics(used, session, key)
        assert "GPU-fake" not in text
        uuids = {
            s.labels["UUID"]
            for s in samples(text)
            if s.name.startswith("gpufleet_gpu_") and "UUID" in s.labels
        }
        assert uuids == {"GPU-n1-0", "GPU-n1-1"}
        dropped = {
            s.labels["reason"]: s.value
            for s in samples(text)
            if s.name == "gpufleet_ingest_dropped_total"
        }
        assert dropped["unknown_device"] == 21


def _made_up() -> str:
    return "rsv_" + "".join(random.choices(string.ascii_letters, k=26))


async def _feed(c: Coordinator, session: aiohttp.ClientSession, key: str) -> list[dict[str, Any]]:
    headers = {"Authorization": f"Bearer {key}"}
    async with session.get(f"{c.url}/api/console/alerts", headers=headers) as resp:
        assert resp.status == 200
        body = await resp.json()
    alerts: list[dict[str, Any]] = body["alerts"]
    return alerts


async def test_processes_naming_made_up_reservations_make_a_bounded_handful_of_alerts(
    used: Coordinator, clock: FakeClock
) -> None:
    async with on_the_bus(used) as (nc, session, api, key):
        agent = await Agent.registered(used, nc, api, gpus=2)
        pool = agent.inv.pool_id
        r = await book_gpus(api, pool, 1)
        rid = str(r["reservationId"])
        g = unit(r)
        (spare,) = {"GPU-n1-0", "GPU-n1-1"} - {g}
        # A real alert first: the other GPU turns unhealthy.
        await agent.beat(devices=(DeviceHealth(device_id=spare, status="unhealthy"),))
        await agent.wait_for("device.unhealthy")
        own = (rid, "reservation")
        # 8 rewrites of 250 processes, each naming a reservation nobody booked (half
        # of them with a real id's pattern), the holder's own process beside them.
        rewrites = 8
        for _ in range(rewrites):
            names = [_made_up() if i % 2 else new_reservation_id() for i in range(250)]
            await agent.report(gpu(g, own, *((n, "reservation") for n in names)))
            await pass_after(used, agent)
            # The processes exit; the next ones are new.
            await agent.report(gpu(g, own))
            await pass_after(used, agent)
        burst = Policy().unit_alert_burst
        said = [a for a in agent.alerts if a.kind == "gpu.foreignUse"]
        assert len(said) == burst
        assert all(a.details["ownerKind"] == "unknown" and a.details["owner"] == "" for a in said)
        assert all(a.reservation_id is None and a.device_id == g for a in said)
        # Use is a condition (issue 34): each said start was ended (ends are never held);
        # the held ones ended before their round, so they are only counted.
        assert sum(a.kind == "gpu.foreignUseEnded" for a in agent.alerts) == burst
        # One more rewrite that keeps running: held, then said in the next round, as
        # one alert counting every start held.
        names = [_made_up() for _ in range(250)]
        await agent.report(gpu(g, own, *((n, "reservation") for n in names)))
        await pass_after(used, agent)
        clock.advance(Policy().unit_alert_every_ms)
        await agent.beat_same_use()
        (summed,) = [
            a for a in await agent.wait_for("gpu.foreignUse", burst + 1) if "repeats" in a.details
        ]
        assert summed.details["repeats"] == rewrites - burst + 1
        for _ in range(3):
            await agent.beat_same_use()
            await asyncio.sleep(0.1)
        assert sum(a.kind == "gpu.foreignUse" for a in agent.alerts) == burst + 1
        events = await used.ledger.catalog.events("n1")
        assert sum(e.kind == "gpu.foreignUse" for e in events) == burst + 1
        # What the metrics say of the GPU stays bounded too.
        await agent.report(gpu(g, own, *((_made_up(), "reservation") for _ in range(250))))
        await pass_after(used, agent)
        text = await metrics(used, session, key)
        users = [
            s for s in samples(text) if s.name == "gpufleet_gpu_user_info" and s.labels["UUID"] == g
        ]
        assert 1 <= len(users) <= MAX_OWNERS_PER_UNIT
        # The real alert is still in the console's feed, for the operator and the tenant.
        tenant_key = (await api.ok("apiKeys.create", {"tenantId": "acme"}))["key"]
        for as_key in (key, tenant_key):
            kinds = [a["kind"] for a in await _feed(used, session, as_key)]
            assert "device.unhealthy" in kinds
