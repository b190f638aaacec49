from __future__ import annotations

from coordinator.domain.liveness import LivenessTracker, NodeLiveness
from shared.clock import FakeClock
from shared.ids import new_pool_id
from tests.factories import make_heartbeat, make_inventory

POOL = new_pool_id()


def _tracker(clock: FakeClock, nodes: int = 3) -> LivenessTracker:
    t = LivenessTracker(misses=3)
    for i in range(nodes):
        inv = make_inventory(f"n{i}", POOL)
        t.load(
            NodeLiveness(f"n{i}", POOL, clock.now_ms(), 1000, inventory_hash=inv.inventory_hash),
            clock.now_ms(),
        )
    return t


def test_silent_node_expires_after_misses_times_its_interval() -> None:
    clock = FakeClock()
    t = _tracker(clock)
    t.bus_up(clock.now_ms())
    clock.advance(3001)
    for i in (0, 1):
        t.on_heartbeat(make_heartbeat(make_inventory(f"n{i}", POOL)), clock.now_ms())
    assert t.expired(clock.now_ms()) == ["n2"]


def test_nothing_expires_while_the_bus_is_down_or_in_the_window_after_reconnect() -> None:
    clock = FakeClock()
    t = _tracker(clock)
    t.bus_up(clock.now_ms())
    t.bus_down()
    clock.advance(60_000)
    assert t.expired(clock.now_ms()) == []
    t.bus_up(clock.now_ms())
    clock.advance(2_999)
    assert t.expired(clock.now_ms()) == []
    clock.advance(2)
    assert sorted(t.expired(clock.now_ms())) == ["n0", "n1", "n2"]


def test_heartbeat_outcomes_flag_health_changes_returns_and_stale_inventory() -> None:
    clock = FakeClock()
    t = _tracker(clock, nodes=1)
    t.recovery_hold_ms = 0
    inv = make_inventory("n0", POOL)
    first = t.on_heartbeat(make_heartbeat(inv), clock.now_ms())
    assert first.known and not first.health_changed and not first.needs_inventory
    t.mark_unreachable(["n0"])
    sick = t.on_heartbeat(make_heartbeat(inv, 2, health="unhealthy"), clock.now_ms())
    assert sick.health_changed and sick.came_back
    stale = t.on_heartbeat(make_heartbeat(inv, 3, inventory_hash="other"), clock.now_ms())
    assert stale.needs_inventory
    unknown = t.on_heartbeat(make_heartbeat(make_inventory("zz", POOL)), clock.now_ms())
    assert not unknown.known


def test_last_seen_is_batched_for_one_flush() -> None:
    clock = FakeClock()
    t = _tracker(clock)
    inv = make_inventory("n1", POOL)
    for seq in range(5):
        clock.advance(10)
        t.on_heartbeat(make_heartbeat(inv, seq), clock.now_ms())
    assert t.take_unflushed() == {"n1": (clock.now_ms(), 1000)}
    assert t.take_unflushed() == {}


def test_a_flapping_node_stays_unreachable_until_it_holds_steady() -> None:
    clock = FakeClock()
    t = _tracker(clock, nodes=1)
    t.recovery_hold_ms = 10_000
    t.bus_up(clock.now_ms())
    inv = make_inventory("n0", POOL)
    transitions = 0
    reachable = True
    # Two heartbeats a second apart, then 5 s of silence, over and over.
    for cycle in range(10):
        for beat in range(2):
            outcome = t.on_heartbeat(make_heartbeat(inv, cycle * 2 + beat), clock.now_ms())
            if outcome.came_back:
                transitions += 1
                reachable = True
            clock.advance(1000)
        clock.advance(4000)
        if t.expired(clock.now_ms()):
            t.mark_unreachable(["n0"])
            if reachable:
                transitions += 1
                reachable = False
    assert transitions == 1  # gone once; never "back" while it keeps flapping
    for seq in range(12):
        outcome = t.on_heartbeat(make_heartbeat(inv, 100 + seq), clock.now_ms())
        clock.advance(1000)
        if outcome.came_back:
            break
    assert outcome.came_back and seq == 10
