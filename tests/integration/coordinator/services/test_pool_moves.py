"""Pool moves (SPEC §5 "Truth under change"), through the node-state workflow, on SQLite
and PostgreSQL: a node whose agent reports another pool while it holds bookings stays in
its old pool, in maintenance, until the last of them ends or is released; then it
moves. The new pool never books what the old pool still promised (before: SQLite
double-booked the node, PostgreSQL answered 503 for good)."""

from __future__ import annotations

from coordinator.ledger import Ledger
from coordinator.services.node_records import (
    NodeOutcome,
    record_inventories,
    record_inventory,
    record_maintenance,
)
from coordinator.services.reservations import Created, Refused
from coordinator.tasks.reservation_clock import ReservationClock
from tests.factories import make_inventory
from tests.rig import HOUR, Rig


async def _events(ledger: Ledger, node_id: str) -> list[str]:
    return [e.kind for e in await ledger.catalog.events(node_id, 0, 100)]


async def _move_with_a_booking(rig: Rig) -> tuple[str, str, str, str]:
    """Pool A's only node, wholly booked, reported in pool B: (A, B, node, reservation)."""
    old = await rig.pool(nodes=1, gpus=8)
    new = await rig.pool(nodes=0)
    node_id = f"{old[-6:]}-n0"
    held = await rig.reservations.create(rig.request(old, "a", gpus=8))
    assert isinstance(held, Created)
    await record_inventory(rig.ledger, make_inventory(node_id, new), rig.clock.now_ms())
    return old, new, node_id, held.reservation.reservation_id


async def test_the_new_pool_books_nothing_the_old_pool_still_promised(ledger: Ledger) -> None:
    """Was: SQLite booked the same 8 GPUs again; PostgreSQL answered 503 for good."""
    rig = await Rig.open(ledger)
    _old, new, _node_id, _ = await _move_with_a_booking(rig)
    out = await rig.reservations.create(rig.request(new, "b", gpus=8))
    assert isinstance(out, Refused) and out.error.code == "CAPACITY_NOT_AVAILABLE"


async def test_a_node_with_bookings_is_held_in_its_pool_until_they_are_released(
    ledger: Ledger,
) -> None:
    rig = await Rig.open(ledger)
    old, new, node_id, rid = await _move_with_a_booking(rig)
    node = await ledger.catalog.node(node_id)
    assert node is not None and node.pool_id == old
    assert node.state.maintenance and node.maintenance_reason == "pool change pending"
    assert (await rig.row(old, "gpu")).maintenance == 8
    assert (await rig.row(new, "gpu")).total == 0
    # The new pool books nothing of it (was: a second booking of the same 8 GPUs).
    out = await rig.reservations.create(rig.request(new, "b", gpus=8))
    assert isinstance(out, Refused) and out.error.code == "CAPACITY_NOT_AVAILABLE"
    # Nor does the old pool, while the move waits.
    out = await rig.reservations.create(rig.request(old, "c", gpus=1, start=rig.clock.now_ms()
                                                    + 2 * HOUR))  # fmt: skip
    assert isinstance(out, Refused)
    assert "node.poolChangePending" in await _events(ledger, node_id)
    assert "node.maintenance" not in await _events(ledger, node_id)

    await rig.reservations.release("acme", rid)
    node = await ledger.catalog.node(node_id)
    assert node is not None and node.pool_id == new and not node.state.maintenance
    assert (await _events(ledger, node_id))[-1] == "node.poolChanged"
    assert [a.kind for a in rig.alerts.alerts][-1] == "node.poolChanged"
    assert (await rig.row(old, "gpu")).total == 0
    assert (await rig.row(new, "gpu")).allocatable == 8
    moved = await rig.reservations.create(rig.request(new, "d", gpus=8))
    assert isinstance(moved, Created)
    assert await ledger.rebuild_all(rig.clock.now_ms()) == 0


async def test_the_batched_path_holds_a_move_too(ledger: Ledger) -> None:
    """The coordinator records inventories in batches (`record_inventories`): a known
    node reported in another pool is held there as well, its booking put at risk."""
    rig = await Rig.open(ledger)
    old = await rig.pool(nodes=1, gpus=8)
    new = await rig.pool(nodes=0)
    node_id = f"{old[-6:]}-n0"
    held = await rig.reservations.create(rig.request(old, "a", gpus=8))
    assert isinstance(held, Created)
    fresh = make_inventory("brand-new", new)
    outcomes = await record_inventories(
        ledger, [make_inventory(node_id, new), fresh], rig.clock.now_ms()
    )
    moved, registered = outcomes
    assert isinstance(moved, NodeOutcome) and moved.pool_id == old
    assert [t.kind for t in moved.transitions] == ["node.poolChangePending"]
    assert moved.put_at_risk == 1
    assert isinstance(registered, NodeOutcome) and registered.pool_id == new
    node = await ledger.catalog.node(node_id)
    assert node is not None and node.pool_id == old
    out = await rig.reservations.create(rig.request(new, "b", gpus=8))
    assert isinstance(out, Created)  # the new node's 8 GPUs, not the held node's
    assert {a.node_id for a in out.reservation.atoms} == {"brand-new"}


async def test_the_clock_moves_the_node_when_its_last_booking_ends(ledger: Ledger) -> None:
    rig = await Rig.open(ledger)
    clock = ReservationClock(ledger, rig.clock, rig.capacity, rig.alerts)
    old, new, node_id, _ = await _move_with_a_booking(rig)
    await clock.tick()
    node = await ledger.catalog.node(node_id)
    assert node is not None and node.pool_id == old
    rig.clock.advance(HOUR)
    await clock.tick()
    node = await ledger.catalog.node(node_id)
    assert node is not None and node.pool_id == new and not node.state.maintenance
    assert "node.poolChanged" in [a.kind for a in rig.alerts.alerts]


async def test_a_node_without_bookings_moves_at_once(ledger: Ledger) -> None:
    rig = await Rig.open(ledger)
    old = await rig.pool(nodes=1)
    new = await rig.pool(nodes=0)
    node_id = f"{old[-6:]}-n0"
    # A reservation that ended long ago holds nothing.
    done = await rig.reservations.create(rig.request(old, "a", gpus=1))
    assert isinstance(done, Created)
    rig.clock.advance(2 * HOUR)
    changes = await record_inventory(ledger, make_inventory(node_id, new), rig.clock.now_ms())
    assert [t.kind for t in changes.transitions] == ["node.poolChanged"]
    node = await ledger.catalog.node(node_id)
    assert node is not None and node.pool_id == new and not node.state.maintenance


async def test_operator_maintenance_and_a_pending_move_share_the_flag(ledger: Ledger) -> None:
    rig = await Rig.open(ledger)
    _old, new, node_id, rid = await _move_with_a_booking(rig)
    now = rig.clock.now_ms()
    # Switching maintenance off does not let the node take bookings in the old pool.
    await record_maintenance(ledger, node_id, False, "", "ops", now)
    node = await ledger.catalog.node(node_id)
    assert node is not None and node.state.maintenance
    # An operator's own reason outlives the move.
    await record_maintenance(ledger, node_id, True, "swap PSU", "ops", now)
    await rig.reservations.release("acme", rid)
    node = await ledger.catalog.node(node_id)
    assert node is not None and node.pool_id == new
    assert node.state.maintenance and node.maintenance_reason == "swap PSU"


async def test_reported_back_in_its_pool_the_move_is_called_off(ledger: Ledger) -> None:
    rig = await Rig.open(ledger)
    old, _new, node_id, _ = await _move_with_a_booking(rig)
    await record_inventory(ledger, make_inventory(node_id, old), rig.clock.now_ms())
    node = await ledger.catalog.node(node_id)
    assert node is not None and node.pool_id == old and not node.state.maintenance
    assert await ledger.nodes.pending_moves() == []
