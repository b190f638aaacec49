"""The node-state service below the bus: a real SQLite ledger, a fake clock, and a
recording alert sink and publisher (no NATS, no socket). The loops' bodies are called by
hand, so each test says exactly when time passes and when the service writes."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from coordinator.domain.liveness import LivenessTracker
from coordinator.domain.states import atom_bucket
from coordinator.ledger import Ledger
from coordinator.services.capacity_signal import CapacitySignal
from coordinator.services.maintenance import Maintenance
from coordinator.services.node_watch import NodeWatch
from shared.clock import FakeClock
from shared.ids import new_pool_id
from shared.subjects import Subjects
from shared.wire import Atom, DeviceHealth, GpuInfo, Inventory
from tests.factories import make_heartbeat, make_inventory
from tests.fakes import RecordingAlerts, RecordingPublisher


class CountingSignal(CapacitySignal):
    def __init__(self) -> None:
        super().__init__()
        self.notified = 0

    def notify(self) -> None:
        self.notified += 1
        super().notify()


class Rig:
    def __init__(self, ledger: Ledger, pool_id: str) -> None:
        self.ledger = ledger
        self.pool_id = pool_id
        self.clock = FakeClock(1_800_000_000_000)
        self.tracker = LivenessTracker(misses=3, recovery_hold_ms=1000)
        self.subjects = Subjects("t")
        self.sink = RecordingAlerts()
        self.bus = RecordingPublisher()
        self.capacity = CountingSignal()
        self.drops: list[tuple[str, str]] = []
        self.leader = True
        self.service = NodeWatch(
            ledger,
            self.tracker,
            self.subjects,
            self.clock,
            self.bus,
            self.sink,
            drop=lambda reason, subject: self.drops.append((reason, subject)),
            capacity=self.capacity,
            is_leader=lambda: self.leader,
        )

    async def inventory(self, inv: Inventory) -> None:
        self.service.on_inventory(inv)
        await self.service.write_pending()


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    ledger = await Ledger.open(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        await ledger.tenants.create("acme", "Acme", 1)
        pool_id = new_pool_id()
        await ledger.pools.create(pool_id, "p", "acme", None, 1)
        rig = Rig(ledger, pool_id)
        await rig.service.load()
        rig.tracker.bus_up(rig.clock.now_ms())
        yield rig
    finally:
        await ledger.close()


async def _events(rig: Rig, node_id: str) -> list[tuple[str, str | None]]:
    return [(e.kind, e.device_id) for e in await rig.ledger.catalog.events(node_id)]


async def test_health_changes_in_heartbeats_are_recorded_and_alerted_one_for_one(
    rig: Rig,
) -> None:
    inv = make_inventory("n1", rig.pool_id, gpus=2, provisioning=True)
    await rig.inventory(inv)
    assert rig.sink.kinds() == ["node.registered", "node.provisioning"]
    steps = [
        (make_heartbeat(inv, 1), ["node.provisioned"]),
        (make_heartbeat(inv, 2, health="degraded"), ["node.degraded"]),
        (make_heartbeat(inv, 3, health="unmonitored"), ["node.unmonitored"]),
        (
            make_heartbeat(
                inv, 4, devices=(DeviceHealth(device_id="GPU-n1-1", status="unhealthy"),)
            ),
            ["node.healthy", "device.unhealthy"],
        ),
        (make_heartbeat(inv, 5), ["device.healthy"]),
    ]
    for hb, kinds in steps:
        before = len(rig.sink.alerts)
        rig.service.on_heartbeat(hb)
        await rig.service.write_pending()
        assert rig.sink.kinds()[before:] == kinds
    assert await _events(rig, "n1") == [(a.kind, a.device_id) for a in rig.sink.alerts]
    assert all(a.pool_id == rig.pool_id and a.node_id == "n1" for a in rig.sink.alerts)
    # A heartbeat that changes nothing writes no event and publishes nothing.
    rig.service.on_heartbeat(make_heartbeat(inv, 6))
    await rig.service.write_pending()
    assert len(rig.sink.alerts) == len(await _events(rig, "n1"))


async def test_silence_marks_unreachable_and_steady_heartbeats_bring_it_back(
    rig: Rig,
) -> None:
    inv = make_inventory("n1", rig.pool_id, gpus=1)
    await rig.inventory(inv)
    rig.service.on_heartbeat(make_heartbeat(inv, 1, interval_ms=1000))
    rig.clock.advance(2_000)
    await rig.service.sweep()
    assert "node.unreachable" not in rig.sink.kinds()  # within 3 x 1 s
    rig.clock.advance(20_000)
    await rig.service.sweep()
    assert rig.sink.kinds()[-1] == "node.unreachable"
    assert rig.sink.alerts[-1].reason == "no heartbeat within misses x interval"
    await rig.service.sweep()
    assert rig.sink.kinds().count("node.unreachable") == 1
    notified = rig.capacity.notified
    for seq in range(2, 5):  # 0, 600, 1200 ms: held for the recovery time
        rig.service.on_heartbeat(make_heartbeat(inv, seq, interval_ms=1000))
        await rig.service.write_pending()
        rig.clock.advance(600)
    assert rig.sink.kinds()[-1] == "node.reachable"
    assert rig.capacity.notified > notified
    assert (await rig.ledger.catalog.node("n1")).state.reachable  # type: ignore[union-attr]


async def test_an_unknown_node_is_asked_for_its_inventory_at_most_every_5s(rig: Rig) -> None:
    inv = make_inventory("n9", rig.pool_id)
    for _ in range(3):
        rig.service.on_heartbeat(make_heartbeat(inv))
        await rig.service.write_pending()
    assert rig.bus.sent == [(rig.subjects.inventory_request(rig.pool_id, "n9"), b"{}")]
    rig.clock.advance(5_000)
    rig.service.on_heartbeat(make_heartbeat(inv))
    await rig.service.write_pending()
    assert len(rig.bus.sent) == 2
    assert rig.sink.alerts == []


async def test_an_inventory_for_an_unknown_pool_is_dropped_and_changes_nothing(
    rig: Rig,
) -> None:
    stray = make_inventory("n1", new_pool_id())
    await rig.inventory(stray)
    assert rig.drops == [("unknown_pool", rig.subjects.inventory(stray.pool_id, "n1"))]
    assert rig.sink.alerts == [] and await rig.ledger.catalog.node("n1") is None


async def test_maintenance_is_recorded_published_and_wakes_waiters_once(rig: Rig) -> None:
    await rig.inventory(make_inventory("n1", rig.pool_id))
    before, notified = len(rig.sink.alerts), rig.capacity.notified
    maintenance = Maintenance(rig.ledger, rig.clock, rig.sink, rig.capacity)

    async def flip(on: bool, reason: str) -> int:
        out = await maintenance.set("n1", on, reason, "ops/alice")
        return int(out.changed)

    assert await flip(True, "swap PSU") == 1
    assert await flip(True, "again") == 0  # already in maintenance: nothing happens
    assert await flip(False, "done") == 1
    got = [(a.kind, a.reason, a.by) for a in rig.sink.alerts[before:]]
    assert got == [
        ("node.maintenance", "swap PSU", "ops/alice"),
        ("node.maintenanceEnded", "done", "ops/alice"),
    ]
    assert rig.capacity.notified - notified == 2
    assert (await _events(rig, "n1"))[-2:] == [
        ("node.maintenance", None),
        ("node.maintenanceEnded", None),
    ]


async def test_a_new_leader_does_not_redo_what_the_old_one_recorded(rig: Rig) -> None:
    inv = make_inventory("n1", rig.pool_id)
    await rig.inventory(inv)
    registered = len(rig.sink.alerts)
    rig.leader = False
    rig.service.on_inventory(inv)  # seen while following
    rig.leader = True
    await rig.service.write_pending()
    assert len(rig.sink.alerts) == registered
    assert [k for k, _ in await _events(rig, "n1")].count("node.registered") == 1


async def _health(rig: Rig, node_id: str) -> str:
    node = await rig.ledger.catalog.node(node_id)
    assert node is not None
    return node.state.health


async def test_a_replayed_old_heartbeat_does_not_overwrite_a_newer_unhealthy(rig: Rig) -> None:
    inv = make_inventory("n1", rig.pool_id)
    await rig.inventory(inv)
    rig.service.on_heartbeat(make_heartbeat(inv, 7, health="unhealthy"))
    await rig.service.write_pending()
    rig.service.on_heartbeat(make_heartbeat(inv, 6))  # delayed or replayed: older seq
    await rig.service.write_pending()
    assert await _health(rig, "n1") == "unhealthy"
    assert rig.drops == [("stale_seq", rig.subjects.heartbeat(rig.pool_id, "n1"))]
    # A new boot starts its sequence over: seq 0 of it counts.
    rig.service.on_heartbeat(make_heartbeat(inv, 0, boot_id="boot-2"))
    await rig.service.write_pending()
    assert await _health(rig, "n1") == "healthy"


async def test_two_hosts_with_one_node_id_are_recorded_once_and_do_not_flap(rig: Rig) -> None:
    inv = make_inventory("n1", rig.pool_id, boot_id="a")
    await rig.inventory(inv)
    for seq in range(1, 6):  # host a healthy, host b unhealthy, interleaving
        rig.service.on_heartbeat(make_heartbeat(inv, seq, boot_id="a"))
        rig.service.on_heartbeat(make_heartbeat(inv, seq, boot_id="b", health="unhealthy"))
        await rig.service.write_pending()
        rig.clock.advance(500)
    # b's inventory is the node's (it is the boot followed); a's would rewrite it: dropped.
    rig.service.on_inventory(make_inventory("n1", rig.pool_id, boot_id="a", gpus=1))
    await rig.service.write_pending()
    kinds = [k for k, _ in await _events(rig, "n1")]
    assert kinds == ["node.registered", "node.unhealthy", "node.duplicateId"]
    assert rig.sink.kinds() == kinds
    duplicate = rig.sink.alerts[-1]
    assert duplicate.details == {"bootId": "b", "otherBootId": "a"}
    assert await _health(rig, "n1") == "unhealthy"
    assert {reason for reason, _ in rig.drops} == {"duplicate_id"}
    assert len(rig.drops) == 4 + 1  # a's heartbeats 2-5 and its inventory
    node = await rig.ledger.catalog.node("n1")
    assert node is not None and len(node.atoms) == len(inv.atoms)


async def test_a_sweep_that_would_mark_most_of_the_fleet_is_held_then_believed(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    invs = [make_inventory(f"n{i}", rig.pool_id, gpus=1) for i in range(6)]
    for inv in invs:
        await rig.inventory(inv)
        rig.service.on_heartbeat(make_heartbeat(inv, 1, interval_ms=1000))
    rig.clock.advance(3_001)
    with caplog.at_level(logging.WARNING):
        await rig.service.sweep()
    assert rig.service.outage_holds == 1
    assert "node.unreachable" not in rig.sink.kinds()
    assert "taken as the coordinator's own outage" in caplog.text
    rig.clock.advance(3_001)  # still silent after their quiet windows, bus up all along
    await rig.service.sweep()
    assert rig.sink.kinds().count("node.unreachable") == 6


async def test_a_missing_gpu_is_recorded_alerted_unhealthy_and_its_return_said(rig: Rig) -> None:
    """SPEC §4 "the agent never hides a device": a GPU the agent cannot read is
    `device.missing` (its atom unhealthy), then `device.healthy` when it is read again,
    whether it kept its id (heartbeats) or its stand-in was replaced (inventory)."""
    inv = make_inventory("n1", rig.pool_id, gpus=2)
    await rig.inventory(inv)
    why = "missing: NVML_ERROR_UNKNOWN (Unable to determine the device handle)"
    gone = (DeviceHealth(device_id="GPU-n1-1", status="unhealthy", reasons=(why,)),)
    for seq, devices, kinds in [
        (1, gone, ["device.missing"]),
        (2, gone, []),  # still missing: said once
        (3, (), ["device.healthy"]),
    ]:
        before = len(rig.sink.alerts)
        rig.service.on_heartbeat(make_heartbeat(inv, seq, devices=devices))
        await rig.service.write_pending()
        assert rig.sink.kinds()[before:] == kinds
    missing = next(a for a in rig.sink.alerts if a.kind == "device.missing")
    assert (missing.device_id, missing.reason) == ("GPU-n1-1", why)

    # A GPU never read: the agent's stand-in (GpuInfo.missing) has an atom that is not
    # allocatable; the GPU read again replaces it.
    standin = "missing-pci-0000:3a:00.0"
    atom = Atom(atom_id=f"n1:gpu:{standin}", cls="gpu", device_id=standin)
    gpu = GpuInfo(
        uuid=standin,
        index=2,
        name="unknown",
        memory_mib=0,
        pci_bus_id="0000:3a:00.0",
        missing="GPU is lost (NVML_ERROR_GPU_IS_LOST)",
    )
    lost = msgspec.structs.replace(
        inv, atoms=(*inv.atoms, atom), gpus=(*inv.gpus, gpu), inventory_hash="with-standin"
    )
    before = len(rig.sink.alerts)
    await rig.inventory(lost)
    assert [(a.kind, a.device_id) for a in rig.sink.alerts[before:]] == [
        ("device.missing", standin)
    ]
    node = await rig.ledger.catalog.node("n1")
    assert node is not None
    record = next(a for a in node.atoms if a.device_id == standin)
    assert atom_bucket(node.state, record) == "unhealthy"
    assert record.health_reasons == ("missing: GPU is lost (NVML_ERROR_GPU_IS_LOST)",)

    found = make_inventory("n1", rig.pool_id, gpus=3)
    before = len(rig.sink.alerts)
    await rig.inventory(found)
    assert [(a.kind, a.device_id) for a in rig.sink.alerts[before:]] == [
        ("device.healthy", standin)
    ]
    assert await _events(rig, "n1") == [(a.kind, a.device_id) for a in rig.sink.alerts]
