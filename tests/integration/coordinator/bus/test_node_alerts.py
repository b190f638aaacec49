"""Every alert kind the coordinator can produce reaches a subscriber on real NATS (SPEC §3:
"every transition is recorded and published as an alert"; §4: one typed list of kinds):
the node's own transitions from inventories, heartbeats, silence and the operator's
maintenance flag in the first test, those that need a live booking (a held pool move,
a reconfigured device, a reservation at risk, recovered or noticed) in the second;
between them, with `test_use_alerts.py` for the kinds of GPU use (`USE_KINDS`), every kind
in `shared.wire.AlertKind`."""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec
import nats
import pytest

from coordinator.app import Coordinator
from shared.clock import FakeClock
from shared.subjects import Subjects
from shared.wire import ALERT_KINDS, USE_KINDS, Alert, Atom, DeviceHealth, Heartbeat, Inventory
from tests.factories import backed, make_heartbeat, make_inventory, renamed
from tests.integration.conftest import Api
from tests.waiting import eventually

# The kinds that need a live booking: the second test drives these, the first the rest.
WITH_BOOKINGS = {
    "node.poolChangePending",
    "device.reconfigured",
    "reservation.notice",
    "reservation.atRisk",
    "reservation.recovered",
}


class Listener:
    def __init__(self, coordinator: Coordinator, nc: nats.NATS) -> None:
        self.subjects = Subjects(coordinator.settings.nats.subject_prefix)
        self.nc = nc
        self.alerts: list[Alert] = []
        self.seq = 0

    async def on_alert(self, msg: nats.aio.msg.Msg) -> None:
        alert = Alert.from_json(msg.data)
        # The subject names the kind too: a subscriber to one kind must get it.
        assert msg.subject == self.subjects.alert(alert.pool_id, alert.node_id, alert.kind)
        self.alerts.append(alert)

    async def wait_for(self, *kinds: str) -> None:
        async def arrived() -> bool:
            got = [a.kind for a in self.alerts]
            return all(k in got for k in kinds)

        await eventually(arrived, within_s=5)

    async def inventory(self, inv: Inventory, *kinds: str) -> None:
        await self.nc.publish(self.subjects.inventory(inv.pool_id, inv.node_id), inv.to_json())
        await self.wait_for(*kinds)

    async def heartbeat(self, hb: Heartbeat, *kinds: str) -> None:
        await self.nc.publish(self.subjects.heartbeat(hb.pool_id, hb.node_id), hb.to_json())
        await self.nc.flush()
        await self.wait_for(*kinds)

    def beat(self, inv: Inventory, **kwargs: object) -> Heartbeat:
        self.seq += 1
        return make_heartbeat(inv, self.seq, **kwargs)  # type: ignore[arg-type]


@pytest.fixture
async def listener(clocked: Coordinator) -> AsyncIterator[Listener]:
    nc = await nats.connect(clocked.settings.nats.url)
    listener = Listener(clocked, nc)
    await nc.subscribe(listener.subjects.all_alerts, cb=listener.on_alert)
    try:
        yield listener
    finally:
        await nc.close()


async def test_every_node_and_device_transition_reaches_a_nats_subscriber(
    clocked: Coordinator, capi: Api, clock: FakeClock, listener: Listener
) -> None:
    await capi.ok("tenants.create", {"tenantId": "acme"})
    pool_a = (await capi.ok("pools.create", {"tenantId": "acme", "name": "a"}))["poolId"]
    pool_b = (await capi.ok("pools.create", {"tenantId": "acme", "name": "b"}))["poolId"]
    inv = make_inventory("n1", pool_a, gpus=2, provisioning=True)
    gpu = "GPU-n1-0"
    on = listener

    await on.inventory(inv, "node.registered", "node.provisioning")
    await on.heartbeat(on.beat(inv), "node.provisioned")
    await on.heartbeat(on.beat(inv, health="degraded"), "node.degraded")
    await on.heartbeat(on.beat(inv, health="unhealthy"), "node.unhealthy")
    await on.heartbeat(on.beat(inv, health="unmonitored"), "node.unmonitored")
    await on.heartbeat(on.beat(inv), "node.healthy")
    for status in ("degraded", "unhealthy"):
        sick = (DeviceHealth(device_id=gpu, status=status, reasons=("xid 79",)),)  # type: ignore[arg-type]
        await on.heartbeat(on.beat(inv, devices=sick), f"device.{status}")
    await on.heartbeat(on.beat(inv), "device.healthy")
    gone = (DeviceHealth(device_id=gpu, status="unhealthy", reasons=("missing: unknown error",)),)
    await on.heartbeat(on.beat(inv, devices=gone), "device.missing")
    await on.heartbeat(on.beat(inv))

    for flag in (True, False):
        await capi.ok(
            "nodes.setMaintenance", {"nodeId": "n1", "maintenance": flag, "reason": "psu"}
        )
    await on.wait_for("node.maintenance", "node.maintenanceEnded")

    # Silence past the detection window (and the start-up quiet period), then heartbeats
    # that keep coming for the recovery hold.
    clock.advance(20_000)
    await on.wait_for("node.unreachable")
    seen = clocked.ingest.accepted["hb"]
    await on.heartbeat(on.beat(inv))

    async def received() -> bool:  # before the clock moves on
        return clocked.ingest.accepted["hb"] > seen

    await eventually(received)
    clock.advance(600)
    await on.heartbeat(on.beat(inv), "node.reachable")

    moved = make_inventory("n1", pool_b, gpus=2)
    await on.inventory(moved, "node.poolChanged")
    # A second host takes the node id (a new boot, as far as anyone can tell), then the
    # first host speaks again: two boots interleave.
    await on.heartbeat(make_heartbeat(moved, 1, boot_id="boot-2"))
    await on.heartbeat(on.beat(moved), "node.duplicateId")
    # The same host under a second node id: held, and the operator keeps the first.
    await on.inventory(renamed(moved, "n2"), "node.duplicateDevice")
    await capi.ok("nodes.replace", {"oldNodeId": "n2", "newNodeId": "n1"})
    await on.wait_for("node.replaced")

    assert {a.kind for a in on.alerts} == set(ALERT_KINDS) - WITH_BOOKINGS - set(USE_KINDS)
    # One alert per recorded transition, in the order the ledger recorded them.
    for node_id in ("n1", "n2"):
        events = await clocked.ledger.catalog.events(node_id)
        assert [(e.kind, e.device_id, e.reason) for e in events] == [
            (a.kind, a.device_id, a.reason) for a in on.alerts if a.node_id == node_id
        ]
    maintenance = [a for a in on.alerts if a.kind.startswith("node.maintenance")]
    assert [a.details["maintenance"] for a in maintenance] == [True, False]
    assert all(a.by.startswith("operator/") for a in maintenance)


def _reservation(pool_id: str, key: str, **extra: object) -> dict[str, object]:
    return {
        "tenantId": "acme",
        "poolId": pool_id,
        "devices": [{"class": "gpu", "count": 1}],
        "duration": "1h",
        "idempotencyKey": key,
    } | extra


async def test_every_kind_that_needs_a_booking_reaches_a_nats_subscriber(
    clocked: Coordinator, capi: Api, listener: Listener
) -> None:
    await capi.ok("tenants.create", {"tenantId": "acme"})
    pool_a = (await capi.ok("pools.create", {"tenantId": "acme", "name": "a"}))["poolId"]
    pool_b = (await capi.ok("pools.create", {"tenantId": "acme", "name": "b"}))["poolId"]
    inv = make_inventory("n1", pool_a, gpus=2)
    on = listener
    await on.inventory(inv, "node.registered")
    await on.heartbeat(on.beat(inv))
    held = await capi.ok("reservations.create", _reservation(pool_a, "held"))
    assert held["state"] == "active"

    # Maintenance puts the holder's reservation at risk; ending it, back.
    for flag in (True, False):
        await capi.ok(
            "nodes.setMaintenance", {"nodeId": "n1", "maintenance": flag, "reason": "psu"}
        )
    await on.wait_for("reservation.atRisk", "reservation.recovered")
    risk = [a for a in on.alerts if a.kind.startswith("reservation.")]
    assert [(a.kind, a.reservation_id) for a in risk] == [
        ("reservation.atRisk", held["reservationId"]),
        ("reservation.recovered", held["reservationId"]),
    ]

    # A spot booking on the other GPU, noticed by a regular request that needs it.
    spot = await capi.ok("reservations.create", _reservation(pool_a, "spot", spot=True))
    regular = await capi.ok("reservations.create", _reservation(pool_a, "regular"))
    assert regular["state"] == "scheduled"
    await on.wait_for("reservation.notice")
    notice = next(a for a in on.alerts if a.kind == "reservation.notice")
    assert notice.reservation_id == spot["reservationId"]

    # A GPU now reported as two time-slice slots: the device is reconfigured.
    gpu = next(a for a in inv.atoms if a.cls == "gpu")
    slots = [
        Atom(atom_id=f"n1:gpu.slot:{gpu.device_id}:{j}", cls="gpu.slot", device_id=gpu.device_id)
        for j in range(2)
    ]
    sliced = backed(
        msgspec.structs.replace(
            inv,
            atoms=(*(a for a in inv.atoms if a != gpu), *slots),
            inventory_hash=inv.inventory_hash + "-sliced",
        )
    )
    await on.inventory(sliced, "device.reconfigured")

    # The host now says it belongs to pool b while it holds bookings here: held back.
    await on.inventory(make_inventory("n1", pool_b, gpus=2), "node.poolChangePending")

    # With the first test: every kind the coordinator has.
    assert {a.kind for a in on.alerts} >= WITH_BOOKINGS
