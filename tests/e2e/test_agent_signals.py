"""The agent's health signals reach the coordinator's buckets and alerts, end to end
(SPEC §4, "the agent never hides a device"): a real `gpufleet-agent --simulate` with a
fault file, a real coordinator, a real nats-server, alerts read by a NATS subscriber.

One agent beating every 0.5 s with a 0.5 s recovery hold walks through: a GPU lost
before its first read (a missing device: its atom unhealthy, `device.missing`), the GPU
read again (its stand-in replaced: `device.healthy`), a reset-required XID held until the
reset (not on a timer), an InfiniBand port down (that NIC's VF atoms unhealthy, the
others not), Fabric Manager not started (the node unhealthy), NVML released for
maintenance (the node unmonitored) and a fabric route unhealthy on one GPU (its health
mask), each undone."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import nats
import pytest

from agent.sim.faults import write_faults
from ops.kit.embedded_nats import EmbeddedNats
from shared.subjects import Subjects
from shared.wire import Alert
from tests.e2e.fleet_procs import Fleet

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

NODE = "hgx-01"
STANDIN = "missing-pci-0000:3a:00.0"  # GPU 2 of h100-sxm-8, named by its PCI address
IB_NIC = "0000:1a:00.0"  # ibp0s0's PCI function: its VFs' device
OTHER_NIC = "0000:2b:00.0"


class Watch:
    """The coordinator's view: its alerts on NATS, and its node over HTTP."""

    def __init__(self, fleet: Fleet, pool: str) -> None:
        self.fleet = fleet
        self.pool = pool
        self.alerts: list[Alert] = []

    async def on_alert(self, msg: Any) -> None:
        self.alerts.append(Alert.from_json(msg.data))

    async def node(self) -> dict[str, Any]:
        op = self.fleet.operator()
        return await asyncio.to_thread(op.call, "nodes.get", {"tenantId": "acme", "nodeId": NODE})

    async def until(
        self, what: str, check: Callable[[dict[str, Any]], bool], within_s: float = 10
    ) -> dict[str, Any]:
        deadline = time.monotonic() + within_s
        node: dict[str, Any] = {}
        while time.monotonic() < deadline:
            try:
                node = await self.node()
            except Exception:  # not registered yet
                node = {}
            if node and check(node):
                return node
            await asyncio.sleep(0.2)
        raise AssertionError(f"{what} not seen within {within_s}s: {node.get('state')}")

    async def alert(self, kind: str, device_id: str | None = None, within_s: float = 5) -> Alert:
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            for a in self.alerts:
                if a.kind == kind and (device_id is None or a.device_id == device_id):
                    return a
            await asyncio.sleep(0.1)
        raise AssertionError(f"no {kind} alert for {device_id}: {[a.kind for a in self.alerts]}")

    async def next_alert(
        self, kind: str, device_id: str | None, after: int, within_s: float = 5
    ) -> Alert:
        """The first `kind` alert for `device_id` beyond the `after` already seen."""
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            found = [a for a in self.alerts if a.kind == kind and device_id in (None, a.device_id)]
            if len(found) > after:
                return found[after]
            await asyncio.sleep(0.1)
        raise AssertionError(f"no new {kind} alert for {device_id}")

    def count(self, kind: str, device_id: str | None = None) -> int:
        return sum(1 for a in self.alerts if a.kind == kind and device_id in (None, a.device_id))


def buckets(node: dict[str, Any], device_id: str) -> set[str]:
    return {a["bucket"] for a in node["atoms"] if a["deviceId"] == device_id}


def gpu_at(node: dict[str, Any], index: int) -> str:
    return str(next(a["deviceId"] for a in node["atoms"] if a["attrs"].get("gpuIndex") == index))


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[tuple[Fleet, Path]]:
    with EmbeddedNats(store_dir=str(tmp_path / "js")) as server:
        fleet = Fleet(tmp_path, server.url)
        try:
            yield fleet, tmp_path
        finally:
            await asyncio.to_thread(fleet.close)


async def test_each_agent_signal_reaches_the_coordinators_buckets_and_alerts(
    rig: tuple[Fleet, Path],
) -> None:
    fleet, tmp = rig
    started = time.monotonic()
    # Ten misses: a loaded test machine must not make the 0.5 s node unreachable.
    await asyncio.to_thread(fleet.start_coordinator, "--misses", "10")
    op = fleet.operator()
    await asyncio.to_thread(op.call, "tenants.create", {"tenantId": "acme"})
    made = await asyncio.to_thread(op.call, "pools.create", {"tenantId": "acme", "name": "hgx"})
    watch = Watch(fleet, made["poolId"])
    nc = await nats.connect(fleet.nats_url)
    try:
        await nc.subscribe(Subjects("gpufleet").all_alerts, cb=watch.on_alert)
        faults, release = tmp / "faults.json", tmp / "release-nvml"
        config = tmp / "agent.toml"
        config.write_text("[health]\nrecover_after_s = 0.5\n")
        # GPU 2 is lost before the agent ever reads it.
        write_faults(faults, [{"kind": "lost", "gpu": 2}])
        fleet.start_agent(
            NODE, watch.pool, "h100-sxm-8", 0.5,
            "--fault-file", str(faults), "--release-file", str(release),
            "--config", str(config),
        )  # fmt: skip

        # 1. Lost before its first read: a missing device, never dropped.
        node = await watch.until("the missing GPU", lambda n: buckets(n, STANDIN) != set())
        assert buckets(node, STANDIN) == {"unhealthy"}
        assert sum(1 for a in node["atoms"] if a["class"] == "gpu") == 8
        missing = await watch.alert("device.missing", STANDIN)
        assert missing.reason.startswith("missing: GPU is lost")
        assert node["state"]["health"]["value"] == "degraded"

        # 2. Read again: the stand-in is replaced by the real GPU; a reset-required XID
        # on GPU 4 arrives at the same time.
        write_faults(faults, [{"kind": "xid", "gpu": 4, "xid": 79}])
        await watch.alert("device.healthy", STANDIN)
        node = await watch.until("GPU 2 read", lambda n: not buckets(n, STANDIN))
        gpu4 = gpu_at(node, 4)
        node = await watch.until("XID 79 held", lambda n: buckets(n, gpu4) == {"unhealthy"})
        assert buckets(node, gpu_at(node, 2)) == {"allocatable"}
        xid = await watch.alert("device.unhealthy", gpu4)
        assert "79" in xid.reason and "reset" in xid.reason

        # 3. An InfiniBand port goes down meanwhile: that NIC's VF atoms only.
        write_faults(
            faults,
            [{"kind": "xid", "gpu": 4, "xid": 79}, {"kind": "port_down", "nic": "ibp0s0"}],
        )
        await watch.alert("device.unhealthy", IB_NIC)
        node = await watch.until("port down", lambda n: buckets(n, IB_NIC) == {"unhealthy"})
        assert buckets(node, OTHER_NIC) == {"allocatable"}
        # Many polls and recovery holds later, the XID still holds GPU 4: no timer.
        assert buckets(node, gpu4) == {"unhealthy"}
        assert watch.count("device.healthy", gpu4) == 0

        # The reset (the recovery action back to none) and the port up: both healthy.
        write_faults(faults, [{"kind": "xid", "gpu": 4, "xid": 79}, {"kind": "reset", "gpu": 4}])
        await watch.alert("device.healthy", gpu4)
        await watch.alert("device.healthy", IB_NIC)
        await watch.until(
            "all healthy", lambda n: {a["bucket"] for a in n["atoms"]} == {"allocatable"}
        )

        # 4. Fabric Manager not started: CUDA is unusable on every GPU, the node is unhealthy.
        write_faults(faults, [{"kind": "fabric", "state": 1}])
        unhealthy = await watch.alert("node.unhealthy")
        assert "abric" in unhealthy.reason
        node = await watch.until("fabric", lambda n: n["status"] == "unhealthy")
        assert {a["bucket"] for a in node["atoms"] if a["class"] == "gpu"} == {"unhealthy"}
        write_faults(faults, [])
        await watch.alert("node.healthy")
        await watch.until("fabric up", lambda n: n["status"] == "ready")

        # 5. NVML released for a reset or driver reload: unmonitored, never silently
        # healthy; the file removed, monitoring resumes.
        release.touch()
        unmonitored = await watch.alert("node.unmonitored")
        assert "released" in unmonitored.reason
        node = await watch.until("released", lambda n: n["status"] == "unhealthy")
        assert node["state"]["health"]["value"] == "unmonitored"
        healthy_before = watch.count("node.healthy")
        release.unlink()
        await watch.until("resumed", lambda n: n["status"] == "ready")
        assert watch.count("node.healthy") == healthy_before + 1

        # 6. The fabric health mask (nvmlDeviceGetGpuFabricInfoV): a route unhealthy on
        # GPU 1 takes that GPU, and only it, out of the allocatable bucket.
        gpu1 = gpu_at(node, 1)
        seen = watch.count("device.unhealthy", gpu1), watch.count("device.healthy", gpu1)
        write_faults(faults, [{"kind": "fabric", "gpu": 1, "state": 3, "mask": 1 << 4}])
        bad = await watch.next_alert("device.unhealthy", gpu1, seen[0])
        assert "fabric: route unhealthy" in bad.reason
        node = await watch.until("route unhealthy", lambda n: buckets(n, gpu1) == {"unhealthy"})
        assert buckets(node, gpu_at(node, 0)) == {"allocatable"}
        write_faults(faults, [])
        await watch.next_alert("device.healthy", gpu1, seen[1])

        # Every alert is a recorded node event, one for one.
        events = (await asyncio.to_thread(op.call, "nodes.events", {"nodeId": NODE}))["events"]
        assert [(e["kind"], e.get("deviceId")) for e in events] == [
            (a.kind, a.device_id) for a in watch.alerts
        ]
    finally:
        await nc.close()
    assert time.monotonic() - started < 40
