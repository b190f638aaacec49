"""The liveness tracker at its boundaries (SPEC §3-4): exactly one window of silence,
exactly the outage threshold, exactly the end of a hold or a duplicate episode — where
a `>` against a `>=` decides whether a node is marked, held or believed."""

from __future__ import annotations

from msgspec.structs import replace

from coordinator.domain.liveness import APPLIED, LivenessTracker, NodeLiveness
from shared.ids import new_pool_id
from shared.wire import DeviceHealth
from tests.factories import make_heartbeat, make_inventory

POOL = new_pool_id()
INV = make_inventory("n0", POOL)
WINDOW = 3000  # misses 3 × 1000 ms


def tracker(nodes: int = 1, now: int = 0, **kw: object) -> LivenessTracker:
    t = LivenessTracker(misses=3, **kw)  # type: ignore[arg-type]
    for i in range(nodes):
        inv = make_inventory(f"n{i}", POOL)
        t.load(NodeLiveness(f"n{i}", POOL, now, 1000, inventory_hash=inv.inventory_hash), now)
    return t


def beat(t: LivenessTracker, now: int, seq: int, boot: str = "b1", **kw: object) -> object:
    return t.on_heartbeat(make_heartbeat(INV, seq, boot_id=boot, **kw), now)  # type: ignore[arg-type]


def test_a_loaded_node_is_quiet_for_its_own_window_and_the_bus_starts_down() -> None:
    t = tracker(now=10_000)
    assert t.nodes["n0"].quiet_until == 10_000 + WINDOW
    assert t.bus_connected is False
    t.bus_up(10_000)
    t.believe_until = 99
    t.bus_up(10_000)
    assert t.believe_until == 0
    t.bus_down()
    assert t.bus_connected is False


def test_intervals_at_the_bounds_are_not_clamped() -> None:
    t = tracker(min_interval_ms=200, max_interval_ms=300_000)
    beat(t, 1, 1)
    low = beat(t, 2, 2, interval_ms=200)
    assert low is APPLIED and t.nodes["n0"].interval_ms == 200
    high = beat(t, 3, 3, interval_ms=300_000)
    assert high is APPLIED and t.nodes["n0"].interval_ms == 300_000
    over = beat(t, 4, 4, interval_ms=300_001)
    assert over.interval_clamped and over.known is True  # type: ignore[attr-defined]
    assert over.came_back is False  # type: ignore[attr-defined]


def test_a_device_health_change_alone_is_a_health_change() -> None:
    t = tracker()
    beat(t, 1, 1)
    sick = (DeviceHealth(device_id="GPU-1", status="unhealthy", reasons=("xid",)),)
    changed = beat(t, 2, 2, devices=sick)
    assert changed.health_changed and changed.known is True  # type: ignore[attr-defined]
    assert t.nodes["n0"].devices == frozenset(sick)
    assert beat(t, 3, 3, devices=sick) is APPLIED
    assert beat(t, 4, 4, provisioning=True, devices=sick).health_changed  # type: ignore[attr-defined]
    assert t.nodes["n0"].provisioning is True
    assert beat(t, 5, 5, provisioning=True, devices=sick) is APPLIED


def test_a_node_back_after_exactly_one_window_gaps_keeps_counting_its_hold() -> None:
    t = tracker(recovery_hold_ms=10_000)
    t.mark_unreachable(["n0"])
    assert t.nodes["n0"].reachable is False and t.nodes["n0"].back_since is None
    outcomes = [beat(t, now, k + 1) for k, now in enumerate(range(0, 15_000, WINDOW))]
    # Gaps of exactly the window are no gap: back after the 10 s hold, at 12 s.
    assert [o.came_back for o in outcomes] == [False, False, False, False, True]  # type: ignore[attr-defined]
    assert t.nodes["n0"].reachable is True


def test_a_node_with_no_boot_known_takes_the_first_boot_whatever_its_seq() -> None:
    t = LivenessTracker(misses=3)
    t.load(NodeLiveness("n0", POOL, 0, 1000, inventory_hash=INV.inventory_hash, seq=5), 0)
    assert beat(t, 1, 3, boot="b1") is APPLIED
    assert t.nodes["n0"].boot_id == "b1" and t.nodes["n0"].seq == 3
    stale = beat(t, 2, 3, boot="b1")
    assert stale.ignored == "stale_seq" and stale.known is True  # type: ignore[attr-defined]


def test_the_old_boot_replaying_its_last_seq_is_stale_not_a_duplicate() -> None:
    t = tracker()
    for seq in range(1, 6):
        beat(t, seq, seq, boot="old")
    beat(t, 6, 1, boot="new")
    replay = beat(t, 7, 5, boot="old")
    assert replay.ignored == "stale_seq" and replay.known is True  # type: ignore[attr-defined]


def test_the_other_boot_exactly_one_window_after_our_last_beat_is_a_duplicate() -> None:
    t = tracker()
    beat(t, 0, 1, boot="old")
    beat(t, 1, 1, boot="new")
    dup = beat(t, 1 + WINDOW, 2, boot="old")
    assert dup.ignored == "duplicate_id" and dup.known is True  # type: ignore[attr-defined]
    assert dup.duplicate == ("new", "old")  # type: ignore[attr-defined]
    until = t.nodes["n0"].rival_until
    assert until == 1 + 2 * WINDOW
    assert t.is_rival("n0", "old", until) and not t.is_rival("n0", "old", until + 1)
    beat(t, until - 10, 2, boot="new")
    # Still the same episode at its last instant: not reported again.
    again = beat(t, until, 3, boot="old")
    assert again.ignored == "duplicate_id" and again.duplicate is None  # type: ignore[attr-defined]


def test_exactly_the_outage_minimum_silent_at_once_is_held() -> None:
    t = tracker(nodes=5)
    t.bus_up(0)
    held = t.sweep(WINDOW + 1)
    assert held.held == 5 and held.expired == ()


def test_exactly_the_outage_fraction_silent_is_marked_not_held() -> None:
    t = tracker(nodes=10)
    t.bus_up(0)
    for i in range(5, 10):
        t.on_heartbeat(make_heartbeat(make_inventory(f"n{i}", POOL), 1), WINDOW)
    swept = t.sweep(WINDOW + 1)
    assert swept.held == 0 and swept.expired == ("n0", "n1", "n2", "n3", "n4")


def test_a_mass_silence_is_believed_only_before_twice_its_window_has_passed() -> None:
    t = tracker(nodes=5)
    t.bus_up(0)
    first = WINDOW + 1
    assert t.sweep(first).held == 5
    assert t.believe_until == first + 2 * WINDOW
    # At exactly the end of the hold the silence is held again, not believed.
    assert t.sweep(first + 2 * WINDOW).held == 5
    believed = t.sweep(first + 2 * WINDOW + WINDOW + 1)
    assert believed.believed and len(believed.expired) == 5
    assert t.believe_until == 0


def test_ages_are_seconds_since_the_last_beat_of_reachable_nodes() -> None:
    t = tracker(nodes=3)
    t.nodes["n1"].last_seen = 3500
    t.mark_unreachable(["n2", "unknown"])
    assert t.ages_s(5000) == [5.0, 1.5]


def test_the_nats_errors_an_agent_reports_are_listed_until_it_reports_none() -> None:
    t = tracker(nodes=2)
    t.on_heartbeat(replace(make_heartbeat(INV, 1, boot_id="b1"), bus_errors=7), 1)
    assert t.bus_errors() == [(POOL, "n0", 7)]
    t.on_heartbeat(replace(make_heartbeat(INV, 2, boot_id="b1"), bus_errors=0), 2)
    assert t.bus_errors() == []
