"""Interval memory under change (SPEC §5 "Truth under change", issue 23), on SQLite and
PostgreSQL: pool-wide memory reservations of the interval API hold a pool move the way
device bookings do, and an interval reservation is at risk while the pool has promised
more memory than it has in service."""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import select

from coordinator.ledger import Ledger, schema
from coordinator.services import alerting
from coordinator.services.intervals import IntervalsBooked
from coordinator.services.node_records import record_inventory, record_reachability
from coordinator.services.reservations import Created, Refused
from coordinator.services.shapes import Shapes
from coordinator.tasks.reservation_clock import ReservationClock
from tests.database import database
from tests.factories import make_inventory
from tests.rig import HOUR, TENANT, Q, Rig


async def _book_memory(rig: Rig, pool_id: str, gb: int, first: int = 0, count: int = 1) -> str:
    out = await rig.intervals.book(TENANT, rig.quarters(first, gb, count), pool_id, None)
    assert isinstance(out, IntervalsBooked)
    return out.reservation.reservation_id


def _quarter(rig: Rig, first: int = 0) -> int:
    now = rig.clock.now_ms()
    return now - now % Q + HOUR + first * Q


def _memory_request(rig: Rig, pool_id: str, key: str, gb: int, start: int) -> Any:
    return rig.request(pool_id, key, gpus=1, resources={"memoryGiB": gb}, start=start,
                       duration="15m")  # fmt: skip


async def _calendar_reservable(rig: Rig, pool_id: str, start: int) -> int:
    usage = await rig.ledger.intervals.reservable(TENANT, pool_id, [start])
    return usage[start].reservable


async def test_pool_memory_holds_a_pool_move(ledger: Ledger) -> None:
    """Was: the node moved at once; pool B booked the 512 GiB that pool A still
    promised (A: total 0, reserved 512; B: total 512, reserved 512), and A's reservation
    was not at risk."""
    rig = await Rig.open(ledger)
    old = await rig.pool(nodes=1, memory_gib=512)
    new = await rig.pool(nodes=0)
    node_id = f"{old[-6:]}-n0"
    start = _quarter(rig)
    await _book_memory(rig, old, 512)

    await record_inventory(ledger, make_inventory(node_id, new), rig.clock.now_ms())

    node = await ledger.catalog.node(node_id)
    assert node is not None and node.pool_id == old
    assert node.state.maintenance and node.maintenance_reason == "pool change pending"
    out = await rig.reservations.create(_memory_request(rig, new, "b", 512, start))
    assert isinstance(out, Refused) and out.error.code == "CAPACITY_NOT_AVAILABLE"
    a = await rig.row(old, "memoryGiB")
    assert (a.total, a.maintenance, a.reserved) == (512, 512, 512)
    assert (await rig.row(new, "memoryGiB")).total == 0
    assert await ledger.rebuild_all(rig.clock.now_ms()) == 0


def _risk_alerts(rig: Rig, rid: str) -> list[tuple[str, str, str]]:
    return [
        (a.kind, a.reason, a.details["tenantId"])
        for a in rig.alerts.alerts
        if a.reservation_id == rid
    ]


async def _reachable(rig: Rig, node_id: str, reachable: bool) -> None:
    """As the sweep (or a heartbeat after silence) records it, alerts published."""
    now = rig.clock.now_ms()
    changes = await record_reachability(rig.ledger, [node_id], reachable, now)
    await alerting.publish(rig.alerts, changes, now)


async def test_a_held_move_puts_the_interval_reservation_at_risk_until_it_moves(
    ledger: Ledger,
) -> None:
    rig = await Rig.open(ledger)
    clock = ReservationClock(ledger, rig.clock, rig.capacity, rig.alerts)
    old = await rig.pool(nodes=1, memory_gib=512)
    new = await rig.pool(nodes=0)
    node_id = f"{old[-6:]}-n0"
    start = _quarter(rig)
    assert await _calendar_reservable(rig, old, start) == 512
    rid = await _book_memory(rig, old, 256)

    changes = await record_inventory(ledger, make_inventory(node_id, new), rig.clock.now_ms())

    assert [t.kind for t in changes.transitions] == ["node.poolChangePending"]
    assert changes.put_at_risk == 1
    (alert,) = changes.alerts[1:]
    assert (alert.kind, alert.reservation_id, alert.details["tenantId"]) == (
        "reservation.atRisk", rid, TENANT,
    )  # fmt: skip
    assert (alert.reason, alert.node_id, alert.pool_id) == ("pool change pending", node_id, old)
    assert await _calendar_reservable(rig, old, start) == 0
    # Held while the quarter is to come; moved once it has ended.
    await clock.tick()
    node = await ledger.catalog.node(node_id)
    assert node is not None and node.pool_id == old
    rig.clock.advance(HOUR + Q)
    await clock.tick()
    node = await ledger.catalog.node(node_id)
    assert node is not None and node.pool_id == new and not node.state.maintenance
    assert await ledger.rebuild_all(rig.clock.now_ms()) == 0


async def test_maintenance_and_unreachability_put_pool_memory_at_risk_and_back(
    ledger: Ledger, database_url: str
) -> None:
    rig = await Rig.open(ledger)
    pool = await rig.pool(nodes=2, memory_gib=512)
    n0, n1 = f"{pool[-6:]}-n0", f"{pool[-6:]}-n1"
    rid = await _book_memory(rig, pool, 768, first=1, count=2)
    other = await _book_memory(rig, pool, 256, first=5)  # a quarter the pool can cover

    first = await rig.maintenance.set(n0, True, "swap PSU", "ops")
    assert first.reservations_at_risk == 1
    assert _risk_alerts(rig, rid) == [("reservation.atRisk", "maintenance", TENANT)]
    await _reachable(rig, n1, False)
    # Still at risk: told once, its reason now the weightier one (stored, not announced).
    assert _risk_alerts(rig, rid) == [("reservation.atRisk", "maintenance", TENANT)]
    rows = await _stored_risk(database_url, rid)
    assert rows is not None and rows["reason"] == "unreachable"
    assert sorted(rows["atoms"]) == [f"{n0}:node", f"{n1}:node"]
    (listed,) = [
        r
        for r in await ledger.intervals.page(TENANT, 0, 2**47, None, 10)
        if r.reservation_id == rid
    ]
    assert listed.at_risk is not None and listed.at_risk.reason == "unreachable"
    await rig.maintenance.set(n0, False, "", "ops")
    assert len(_risk_alerts(rig, rid)) == 1  # n0 alone covers 512 of 768: still short
    await _reachable(rig, n1, True)
    assert _risk_alerts(rig, rid) == [
        ("reservation.atRisk", "maintenance", TENANT),
        ("reservation.recovered", "recovered from unreachable", TENANT),
    ]
    assert await _stored_risk(database_url, rid) is None
    # The reservation whose quarter one node covers was never at risk; an unreachable
    # node alone put `other` at risk once the pool was down to nothing.
    assert [k for k, _, _ in _risk_alerts(rig, other)] == [
        "reservation.atRisk", "reservation.recovered",
    ]  # fmt: skip


async def test_memory_the_rest_of_the_pool_covers_puts_nothing_at_risk_nor_holds(
    ledger: Ledger,
) -> None:
    rig = await Rig.open(ledger)
    old = await rig.pool(nodes=2, memory_gib=512)
    new = await rig.pool(nodes=0)
    n0 = f"{old[-6:]}-n0"
    rid = await _book_memory(rig, old, 512)
    out = await rig.maintenance.set(n0, True, "swap PSU", "ops")
    assert out.reservations_at_risk == 0
    await rig.maintenance.set(n0, False, "", "ops")
    changes = await record_inventory(ledger, make_inventory(n0, new), rig.clock.now_ms())
    assert [t.kind for t in changes.transitions] == ["node.poolChanged"]
    assert _risk_alerts(rig, rid) == []
    assert (await rig.row(old, "memoryGiB")).allocatable == 512


async def test_node_level_memory_on_the_other_nodes_counts_against_the_move(
    ledger: Ledger,
) -> None:
    """The other node's memory is booked by a compute reservation in that quarter:
    without the moving node, nothing is left for the interval reservation."""
    rig = await Rig.open(ledger)
    old = await rig.pool(nodes=2, memory_gib=512)
    new = await rig.pool(nodes=0)
    n0, n1 = f"{old[-6:]}-n0", f"{old[-6:]}-n1"
    start = _quarter(rig)
    await _book_memory(rig, old, 512)
    held = await rig.reservations.create(_memory_request(rig, old, "m", 512, start))
    assert isinstance(held, Created)
    moving = n0 if held.reservation.atoms[0].node_id == n1 else n1
    await record_inventory(ledger, make_inventory(moving, new), rig.clock.now_ms())
    node = await ledger.catalog.node(moving)
    assert node is not None and node.pool_id == old and node.state.maintenance


async def _stored_risk(url: str, rid: str) -> dict[str, Any] | None:
    iv = schema.interval_reservations.c
    async with database(url) as db, db.read() as conn:
        value = (
            await conn.execute(select(iv.at_risk).where(iv.reservation_id == rid))
        ).scalar_one()
    return cast("dict[str, Any] | None", value)


async def test_the_clock_lets_a_reservation_recover_once_its_short_quarter_ends(
    ledger: Ledger,
) -> None:
    rig = await Rig.open(ledger)
    clock = ReservationClock(ledger, rig.clock, rig.capacity, rig.alerts)
    pool = await rig.pool(nodes=2, memory_gib=512)
    body = rig.quarters(0, 768)
    body["intervals"] += rig.quarters(4, 256)["intervals"]
    out = await rig.intervals.book(TENANT, body, pool, None)
    assert isinstance(out, IntervalsBooked)
    rid = out.reservation.reservation_id
    await rig.maintenance.set(f"{pool[-6:]}-n0", True, "swap PSU", "ops")
    assert [k for k, _, _ in _risk_alerts(rig, rid)] == ["reservation.atRisk"]

    rig.clock.advance(HOUR + Q)  # the short quarter has ended; the one left fits in 512
    await clock.tick()

    assert _risk_alerts(rig, rid)[1:] == [
        ("reservation.recovered", "recovered from maintenance", TENANT)
    ]


async def test_a_shape_hold_puts_pool_memory_at_risk_with_its_reason_and_back(
    ledger: Ledger,
) -> None:
    """Issue 31: a node held for exceeding its expected shape leaves the pool's memory
    like maintenance does: the interval reservation it covered is at risk with reason
    `shape` (was: `provisioning`, a reason no other answer uses), the memory stays
    reserved as under the other holds, and accepting the shape clears it."""
    rig = await Rig.open(ledger)
    shapes = Shapes(ledger, rig.clock, rig.alerts, rig.capacity)
    pool = await rig.pool(nodes=1, gpus=8, memory_gib=512)
    node_id = f"{pool[-6:]}-n0"
    rid = await _book_memory(rig, pool, 512)
    await rig.maintenance.set(node_id, True, "swap PSU", "ops")
    maintained = await rig.row(pool, "memoryGiB")
    await rig.maintenance.set(node_id, False, "", "ops")
    told = len(_risk_alerts(rig, rid))

    await shapes.expect(pool, None, {"gpu": 4}, "ops")

    assert _risk_alerts(rig, rid)[told:] == [("reservation.atRisk", "shape", TENANT)]
    (listed,) = [
        r
        for r in await ledger.intervals.page(TENANT, 0, 2**47, None, 10)
        if r.reservation_id == rid
    ]
    assert listed.at_risk is not None and listed.at_risk.reason == "shape"
    row = await rig.row(pool, "memoryGiB")
    assert (row.provisioning, row.allocatable, row.reserved) == (
        maintained.maintenance, maintained.allocatable, maintained.reserved,
    )  # fmt: skip

    await shapes.accept(node_id, "ops")

    assert [k for k, _, _ in _risk_alerts(rig, rid)][-1] == "reservation.recovered"
    (listed,) = [
        r
        for r in await ledger.intervals.page(TENANT, 0, 2**47, None, 10)
        if r.reservation_id == rid
    ]
    assert listed.at_risk is None
    assert await ledger.rebuild_all(rig.clock.now_ms()) == 0
