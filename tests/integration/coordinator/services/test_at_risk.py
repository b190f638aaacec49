"""At-risk reservations and reconfiguration (SPEC §5 "Truth under change"), through the
node-state workflows on SQLite and PostgreSQL with a recording alert sink.

A reservation any of whose atoms is unreachable, unhealthy, in maintenance, held for a
pool move or reconfigured says so in every answer (`atRisk: {reason, since, atoms}`);
its tenant hears `reservation.atRisk` when it happens and `reservation.recovered` when
it clears. (Before: reservations stayed silently `active` on a dead node.)"""

from __future__ import annotations

import msgspec

from coordinator.api.http.render import reservation as render
from coordinator.api.shapes.base import dump
from coordinator.domain.placement_model import DeviceRequest, PlacementRequest
from coordinator.ledger import Ledger
from coordinator.services import alerting
from coordinator.services.node_records import (
    record_heartbeat,
    record_inventory,
    record_reachability,
)
from coordinator.services.reservations import Created
from coordinator.services.shapes import Shapes
from shared.wire import Atom, DeviceHealth, Inventory
from tests.factories import backed, make_heartbeat, make_inventory
from tests.rig import HOUR, TENANT, Rig


async def _booked(rig: Rig, gpus: int = 1, key: str = "a") -> tuple[str, str, str]:
    """A pool of one 8-GPU node and a reservation on it: (pool, node, reservation)."""
    pool = await rig.pool(nodes=1, gpus=8)
    out = await rig.reservations.create(rig.request(pool, key, gpus=gpus))
    assert isinstance(out, Created)
    return pool, f"{pool[-6:]}-n0", out.reservation.reservation_id


async def _answer(rig: Rig, rid: str) -> dict[str, object]:
    return dump(render(await rig.ledger.reservations.get(rid, TENANT), rig.clock.now_ms()))


def _kinds(rig: Rig) -> list[str]:
    return [a.kind for a in rig.alerts.alerts]


async def test_maintenance_puts_the_holders_reservation_at_risk_and_back(ledger: Ledger) -> None:
    rig = await Rig.open(ledger)
    _, node_id, rid = await _booked(rig)
    start = rig.clock.now_ms()
    out = await rig.maintenance.set(node_id, True, "swap PSU", "ops")
    assert out.reservations_at_risk == 1
    answer = await _answer(rig, rid)
    atoms = [a["atomId"] for a in answer["atoms"]]  # type: ignore[attr-defined]
    assert answer["state"] == "active"
    assert answer["atRisk"] == {"reason": "maintenance", "since": start, "atoms": atoms}
    alert = next(a for a in rig.alerts.alerts if a.kind == "reservation.atRisk")
    assert (alert.reservation_id, alert.node_id) == (rid, node_id)
    assert alert.details["tenantId"] == TENANT and alert.details["reason"] == "maintenance"
    # Repeating it puts nothing more at risk and says nothing new.
    again = await rig.maintenance.set(node_id, True, "swap PSU", "ops")
    assert again.reservations_at_risk == 0 and _kinds(rig).count("reservation.atRisk") == 1

    rig.clock.advance(60_000)
    back = await rig.maintenance.set(node_id, False, "", "ops")
    assert back.reservations_at_risk == 0
    assert "atRisk" not in await _answer(rig, rid)
    assert _kinds(rig)[-1] == "reservation.recovered"
    assert rig.alerts.alerts[-1].details["tenantId"] == TENANT


async def test_an_unreachable_node_puts_what_it_holds_at_risk(ledger: Ledger) -> None:
    rig = await Rig.open(ledger)
    pool, node_id, rid = await _booked(rig)
    # A reservation on another node of another pool is not touched.
    _, _, other = await _booked(rig, key="b")
    changes = await record_reachability(ledger, [node_id], False, rig.clock.now_ms())
    await alerting.publish(rig.alerts, changes, rig.clock.now_ms())
    assert (await _answer(rig, rid))["atRisk"]["reason"] == "unreachable"  # type: ignore[index]
    assert "atRisk" not in await _answer(rig, other)
    assert _kinds(rig)[-2:] == ["node.unreachable", "reservation.atRisk"]
    changes = await record_reachability(ledger, [node_id], True, rig.clock.now_ms())
    await alerting.publish(rig.alerts, changes, rig.clock.now_ms())
    assert "atRisk" not in await _answer(rig, rid)
    assert _kinds(rig)[-1] == "reservation.recovered"
    assert pool


async def test_an_unhealthy_device_puts_only_its_holders_at_risk(ledger: Ledger) -> None:
    rig = await Rig.open(ledger)
    pool, node_id, rid = await _booked(rig)
    other = await rig.reservations.create(rig.request(pool, "b", gpus=1))
    assert isinstance(other, Created)
    answer = await _answer(rig, rid)
    device = next(
        a.device_id
        for a in (await ledger.catalog.node(node_id)).atoms  # type: ignore[union-attr]
        if a.atom_id == answer["atoms"][0]["atomId"]  # type: ignore[index]
    )
    inv = make_inventory(node_id, pool)
    hb = make_heartbeat(inv, devices=(DeviceHealth(device_id=device, status="unhealthy"),))
    await record_heartbeat(ledger, hb, rig.clock.now_ms())
    assert (await _answer(rig, rid))["atRisk"]["reason"] == "unhealthy"  # type: ignore[index]
    assert "atRisk" not in await _answer(rig, other.reservation.reservation_id)


async def test_a_whole_node_booked_with_a_faulty_device_is_at_risk_from_the_start(
    ledger: Ledger,
) -> None:
    """A whole-node booking takes the node's faulty devices too (found by the simulation,
    tests/integration/coordinator/ledger/test_simulation.py): it is at risk from its first
    answer, and stays so without an alert until the device recovers. (Before: no flag until some
    unrelated change of the node re-judged it, which then sent `reservation.atRisk`
    though nothing had happened to it.)"""
    rig = await Rig.open(ledger)
    pool = await rig.pool(nodes=1, gpus=2)
    node_id = f"{pool[-6:]}-n0"
    atoms = (await ledger.catalog.node(node_id)).atoms  # type: ignore[union-attr]
    sick = next(a for a in atoms if a.cls == "gpu")
    inv = make_inventory(node_id, pool)
    sick_hb = make_heartbeat(
        inv, devices=(DeviceHealth(device_id=sick.device_id, status="unhealthy"),)
    )
    await record_heartbeat(ledger, sick_hb, rig.clock.now_ms())
    out = await rig.reservations.create(
        rig.request(pool, "whole", devices=[{"class": "node", "count": 1}])
    )
    assert isinstance(out, Created)
    rid, since = out.reservation.reservation_id, rig.clock.now_ms()
    want = {"reason": "unhealthy", "since": since, "atoms": [sick.atom_id]}
    assert dump(render(out.reservation, since))["atRisk"] == want
    assert (await _answer(rig, rid))["atRisk"] == want
    # Maintenance changes the reason while it lasts, not the flag: nothing to announce.
    rig.clock.advance(60_000)
    on = await rig.maintenance.set(node_id, True, "swap PSU", "ops")
    assert on.reservations_at_risk == 0
    assert (await _answer(rig, rid))["atRisk"]["reason"] == "maintenance"  # type: ignore[index]
    await rig.maintenance.set(node_id, False, "", "ops")
    assert (await _answer(rig, rid))["atRisk"] == want
    assert not [a.kind for a in rig.alerts.alerts if a.reservation_id == rid]
    healed = make_heartbeat(inv, devices=())
    changes = await record_heartbeat(ledger, healed, rig.clock.now_ms())
    assert changes is not None
    await alerting.publish(rig.alerts, [changes], rig.clock.now_ms())
    assert "atRisk" not in await _answer(rig, rid)
    assert rig.alerts.alerts[-1].kind == "reservation.recovered"
    assert rig.alerts.alerts[-1].details["reason"] == "unhealthy"


async def test_a_reservation_ended_is_not_at_risk(ledger: Ledger) -> None:
    rig = await Rig.open(ledger)
    _, node_id, rid = await _booked(rig)
    await rig.reservations.release(TENANT, rid)
    out = await rig.maintenance.set(node_id, True, "swap PSU", "ops")
    assert out.reservations_at_risk == 0 and "atRisk" not in await _answer(rig, rid)


def _gpu(node: str, i: int) -> Atom:
    return Atom(atom_id=f"{node}:gpu:G{i}", cls="gpu", device_id=f"G{i}")


def _slots(node: str, i: int, k: int) -> list[Atom]:
    return [Atom(atom_id=f"{node}:slot:G{i}:{j}", cls="gpu.slot", device_id=f"G{i}")
            for j in range(k)]  # fmt: skip


def _inventory(node: str, pool: str, atoms: list[Atom], tag: str) -> Inventory:
    base = make_inventory(node, pool, gpus=0)
    return backed(
        msgspec.structs.replace(
            base, atoms=(*base.atoms, *atoms), inventory_hash=f"{base.inventory_hash}{tag}"
        )
    )


async def test_a_reconfigured_gpu_keeps_its_booking_at_risk_and_its_new_forms_wait(
    ledger: Ledger,
) -> None:
    """Through the node-state workflow: a booked whole GPU becomes 2 time-slice slots.
    The change is a `device.reconfigured` event and alert, the holder's reservation is
    at risk, and the slots are bookable only outside the booking's window."""
    rig = await Rig.open(ledger)
    pool = await rig.pool(nodes=0)
    node = "rc-n0"
    now = rig.clock.now_ms()
    await record_inventory(ledger, _inventory(node, pool, [_gpu(node, 0)], "whole"), now)
    held = await rig.reservations.create(rig.request(pool, "a", gpus=1))
    assert isinstance(held, Created)
    rid = held.reservation.reservation_id

    changes = await record_inventory(ledger, _inventory(node, pool, _slots(node, 0, 2), "s"), now)
    await alerting.publish(rig.alerts, [changes], now)
    assert [t.kind for t in changes.transitions] == ["device.reconfigured"]
    assert [e.kind for e in await ledger.catalog.events(node, 0, 100)][-1] == "device.reconfigured"
    assert _kinds(rig)[-2:] == ["device.reconfigured", "reservation.atRisk"]
    assert (await _answer(rig, rid))["atRisk"]["reason"] == "reconfigured"  # type: ignore[index]
    # The booking keeps the device: no slot of it overlaps the booked hour.
    slot = PlacementRequest(devices=(DeviceRequest("gpu.slot", 1),))
    placement = (await ledger.bookings.preview(pool, slot, now, now + HOUR, now, 60_000)).placement
    assert not placement.fits
    placement = (
        await ledger.bookings.preview(pool, slot, now + HOUR, now + 2 * HOUR, now, 60_000)
    ).placement
    assert placement.fits
    # The old form back: the booking's atom is current again and it recovers.
    changes = await record_inventory(ledger, _inventory(node, pool, [_gpu(node, 0)], "w2"), now)
    await alerting.publish(rig.alerts, [changes], now)
    assert "atRisk" not in await _answer(rig, rid)
    assert _kinds(rig)[-1] == "reservation.recovered"


async def test_a_pending_pool_move_puts_the_reservations_it_waits_for_at_risk(
    ledger: Ledger,
) -> None:
    rig = await Rig.open(ledger)
    _, node_id, rid = await _booked(rig)
    new = await rig.pool(nodes=0)
    changes = await record_inventory(ledger, make_inventory(node_id, new), rig.clock.now_ms())
    await alerting.publish(rig.alerts, [changes], rig.clock.now_ms())
    risk = (await _answer(rig, rid))["atRisk"]
    assert risk["reason"] == "pool change pending"  # type: ignore[index]
    assert _kinds(rig)[-2:] == ["node.poolChangePending", "reservation.atRisk"]


async def test_a_shape_hold_puts_the_nodes_bookings_at_risk_like_maintenance(
    ledger: Ledger,
) -> None:
    """Issue 31: an expected shape of 4 GPUs set over an 8-GPU node with 3 scheduled
    reservations of all 8 moved the gpu row to `provisioning 8, reserved 0` and left
    the reservations `atRisk: none`. A shape hold is a hold like maintenance: the row
    counts the bookings as maintenance does, each reservation is at risk with reason
    `shape` (told once), and accepting the shape clears it (told once)."""
    rig = await Rig.open(ledger)
    shapes = Shapes(ledger, rig.clock, rig.alerts, rig.capacity)
    pool = await rig.pool(nodes=1, gpus=8)
    node_id = f"{pool[-6:]}-n0"
    now = rig.clock.now_ms()
    rids = []
    for k in range(3):
        start = now + (k + 1) * HOUR
        out = await rig.reservations.create(rig.request(pool, f"s{k}", gpus=8, start=start))
        assert isinstance(out, Created)
        rids.append(out.reservation.reservation_id)
        assert (await _answer(rig, rids[-1]))["state"] == "scheduled"
    # What the other holds make of the row: maintenance, on and off again.
    await rig.maintenance.set(node_id, True, "swap PSU", "ops")
    maintained = await rig.row(pool, "gpu")
    await rig.maintenance.set(node_id, False, "", "ops")
    before = len(rig.alerts.alerts)

    await shapes.expect(pool, None, {"gpu": 4}, "ops")

    row = await rig.row(pool, "gpu")
    assert (row.provisioning, row.allocatable, row.allocated, row.reserved) == (
        maintained.maintenance, maintained.allocatable, maintained.allocated, maintained.reserved,
    )  # fmt: skip
    for rid in rids:
        risk = (await _answer(rig, rid))["atRisk"]
        assert risk["reason"] == "shape" and len(risk["atoms"]) == 8  # type: ignore[index]
    told = [(a.kind, a.reservation_id, a.details.get("reason")) for a in rig.alerts.alerts[before:]]
    assert [t for t in told if t[0] == "reservation.atRisk"] == [
        ("reservation.atRisk", rid, "shape") for rid in sorted(rids)
    ]
    assert await ledger.rebuild_all(rig.clock.now_ms()) == 0

    await shapes.accept(node_id, "ops")

    for rid in rids:
        assert "atRisk" not in await _answer(rig, rid)
    recovered = [a.reservation_id for a in rig.alerts.alerts if a.kind == "reservation.recovered"]
    assert sorted(recovered[-3:]) == sorted(rids)
    row = await rig.row(pool, "gpu")
    assert (row.allocatable, row.reserved, row.provisioning) == (8, 8, 0)
