"""The liveness rules of SPEC §3-4 on the pure tracker, with nodes of DIFFERENT intervals
and a fake clock: per-node quiet window, interval bounds, the mass-silence guard, and
bootId/seq."""

from __future__ import annotations

from coordinator.domain.liveness import LivenessTracker, NodeLiveness
from shared.clock import FakeClock
from shared.ids import new_pool_id
from shared.wire import Heartbeat
from tests.factories import make_heartbeat, make_inventory

POOL = new_pool_id()
S = 1000

# node id → announced interval (ms); the 3600 s one is clamped to the 300 s maximum.
MIXED = {"one": 1 * S, "five": 5 * S, "sixty": 60 * S, "hour": 3600 * S}


def _hb(node_id: str, seq: int, interval_ms: int, **kw: object) -> Heartbeat:
    return make_heartbeat(make_inventory(node_id, POOL), seq, interval_ms=interval_ms, **kw)  # type: ignore[arg-type]


def _fleet(clock: FakeClock, intervals: dict[str, int], **kw: object) -> LivenessTracker:
    t = LivenessTracker(misses=3, **kw)  # type: ignore[arg-type]
    for node_id, interval in intervals.items():
        digest = make_inventory(node_id, POOL).inventory_hash
        now = clock.now_ms()
        t.load(NodeLiveness(node_id, POOL, now, interval, inventory_hash=digest), now)
    return t


def _beat_all(t: LivenessTracker, clock: FakeClock, intervals: dict[str, int], seq: int) -> None:
    for node_id, interval in intervals.items():
        t.on_heartbeat(_hb(node_id, seq, interval), clock.now_ms())


def _expiry_times(t: LivenessTracker, clock: FakeClock, until_ms: int) -> dict[str, int]:
    """When each node first expires, in ms from now, stepping the clock in 100 ms steps
    (fine enough: the windows are whole seconds)."""
    start = clock.now_ms()
    seen: dict[str, int] = {}
    while clock.now_ms() - start <= until_ms:
        for node_id in t.expired(clock.now_ms()):
            seen.setdefault(node_id, clock.now_ms() - start)
        clock.advance(100)
    return seen


def test_after_a_reconnect_each_node_is_quiet_for_its_own_window_not_the_fleets() -> None:
    clock = FakeClock()
    t = _fleet(clock, MIXED)
    t.bus_up(clock.now_ms())
    _beat_all(t, clock, MIXED, 1)
    t.bus_down()
    clock.advance(600 * S)  # a long outage: every node is far past its window
    assert t.expired(clock.now_ms()) == []
    t.bus_up(clock.now_ms())
    # Nobody speaks after the reconnect: each node goes at its OWN misses x interval.
    assert _expiry_times(t, clock, 901 * S) == {
        "one": 3 * S + 100,
        "five": 15 * S + 100,
        "sixty": 180 * S + 100,
        "hour": 900 * S + 100,  # 3 x the 300 s maximum, not 3 x 3600 s
    }


def test_a_quiet_window_protects_a_node_that_speaks_within_it() -> None:
    clock = FakeClock()
    t = _fleet(clock, MIXED)
    t.bus_up(clock.now_ms())
    t.bus_down()
    clock.advance(600 * S)
    t.bus_up(clock.now_ms())
    clock.advance(2 * S)
    t.on_heartbeat(_hb("one", 1, S), clock.now_ms())
    clock.advance(2 * S)
    # 4 s after the reconnect: "one" spoke within its window, the others are in theirs.
    assert t.expired(clock.now_ms()) == []


def test_at_start_each_loaded_node_is_quiet_for_its_own_window() -> None:
    clock = FakeClock()
    t = _fleet(clock, MIXED)
    for node in t.nodes.values():
        node.last_seen -= 3600 * S  # the ledger saw them an hour ago
    t.bus_up(clock.now_ms())
    assert _expiry_times(t, clock, 16 * S) == {"one": 3 * S + 100, "five": 15 * S + 100}


def test_out_of_bounds_intervals_are_clamped_and_reported() -> None:
    clock = FakeClock()
    t = _fleet(clock, {"fast": S, "slow": S}, min_interval_ms=500, max_interval_ms=60 * S)
    t.bus_up(clock.now_ms())
    clock.advance(3 * S + 1)  # past the quiet window after start
    fast = t.on_heartbeat(_hb("fast", 1, 100), clock.now_ms())
    slow = t.on_heartbeat(_hb("slow", 1, 3600 * S), clock.now_ms())
    ok = t.on_heartbeat(_hb("fast", 2, 800), clock.now_ms())
    assert (fast.interval_clamped, slow.interval_clamped, ok.interval_clamped) == (
        True,
        True,
        False,
    )
    t.on_heartbeat(_hb("fast", 3, 100), clock.now_ms())
    assert t.take_unflushed() == {"fast": (clock.now_ms(), 500), "slow": (clock.now_ms(), 60 * S)}
    assert _expiry_times(t, clock, 181 * S) == {"fast": 1500 + 100, "slow": 180 * S + 100}


def _ten_nodes(clock: FakeClock, **kw: object) -> tuple[LivenessTracker, dict[str, int]]:
    # Six 1 s nodes and four 60 s nodes.
    intervals = {f"s{i}": S for i in range(6)} | {f"l{i}": 60 * S for i in range(4)}
    t = _fleet(clock, intervals, outage_fraction=0.5, outage_min_nodes=3, **kw)
    t.bus_up(clock.now_ms())
    _beat_all(t, clock, intervals, 1)
    return t, intervals


def test_a_sweep_that_would_mark_most_of_the_fleet_holds_and_rearms_the_quiet_windows() -> None:
    clock = FakeClock()
    t, _ = _ten_nodes(clock)
    clock.advance(3 * S + 1)  # the six 1 s nodes all fall silent at once: 6 of 10
    held = t.sweep(clock.now_ms())
    assert (held.expired, held.held) == ((), 6)
    # Re-armed: each node quiet again for its own window.
    clock.advance(3 * S)
    assert t.sweep(clock.now_ms()).expired == ()
    assert all(n.reachable for n in t.nodes.values())


def test_a_mass_silence_that_outlasts_its_hold_is_believed() -> None:
    clock = FakeClock()
    t, _ = _ten_nodes(clock)
    clock.advance(3 * S + 1)
    assert t.sweep(clock.now_ms()).held == 6
    clock.advance(3 * S + 1)  # still silent after their re-armed windows, bus up all along
    believed = t.sweep(clock.now_ms())
    assert believed.believed and sorted(believed.expired) == [f"s{i}" for i in range(6)]


def test_a_reconnect_starts_a_new_episode_so_the_next_mass_silence_is_held_again() -> None:
    clock = FakeClock()
    t, _ = _ten_nodes(clock)
    clock.advance(3 * S + 1)
    assert t.sweep(clock.now_ms()).held == 6
    t.bus_down()
    t.bus_up(clock.now_ms())
    clock.advance(3 * S + 1)
    assert t.sweep(clock.now_ms()).held == 6


def test_a_minority_or_a_handful_is_marked_at_once() -> None:
    clock = FakeClock()
    t, _ = _ten_nodes(clock)
    clock.advance(2 * S)
    for node_id in ["s0", "s1", "s2"]:  # 3 of 6 short nodes keep talking
        t.on_heartbeat(_hb(node_id, 2, S), clock.now_ms())
    clock.advance(1 * S + 1)
    assert sorted(t.sweep(clock.now_ms()).expired) == ["s3", "s4", "s5"]
    small = _fleet(clock, {"a": S, "b": S}, outage_fraction=0.5, outage_min_nodes=3)
    small.bus_up(clock.now_ms())
    clock.advance(3 * S + 1)
    assert sorted(small.sweep(clock.now_ms()).expired) == ["a", "b"]  # 2 < min nodes


def test_an_older_seq_of_the_same_boot_is_ignored() -> None:
    clock = FakeClock()
    t = _fleet(clock, {"n": S})
    t.on_heartbeat(_hb("n", 5, S), clock.now_ms())
    sick = t.on_heartbeat(_hb("n", 7, S, health="unhealthy"), clock.now_ms())
    assert sick.health_changed
    replay = t.on_heartbeat(_hb("n", 6, S), clock.now_ms())
    again = t.on_heartbeat(_hb("n", 7, S), clock.now_ms())
    assert (replay.ignored, again.ignored) == ("stale_seq", "stale_seq")
    assert not replay.health_changed and t.nodes["n"].health == "unhealthy"


def test_a_stale_heartbeat_does_not_keep_a_node_alive() -> None:
    clock = FakeClock()
    t = _fleet(clock, {"n": S})
    t.bus_up(clock.now_ms())
    t.on_heartbeat(_hb("n", 9, S), clock.now_ms())
    clock.advance(2 * S)
    t.on_heartbeat(_hb("n", 3, S), clock.now_ms())
    clock.advance(1 * S + 1)
    assert t.expired(clock.now_ms()) == ["n"]


def test_a_new_boot_starts_its_sequence_over_and_a_replay_of_the_old_boot_is_stale() -> None:
    clock = FakeClock()
    t = _fleet(clock, {"n": S})
    t.on_heartbeat(_hb("n", 500, S, boot_id="old"), clock.now_ms())
    fresh = t.on_heartbeat(_hb("n", 0, S, boot_id="new", health="unhealthy"), clock.now_ms())
    assert fresh.ignored is None and fresh.health_changed
    replay = t.on_heartbeat(_hb("n", 499, S, boot_id="old"), clock.now_ms())
    assert (replay.ignored, replay.duplicate) == ("stale_seq", None)
    assert t.nodes["n"].health == "unhealthy"


def test_two_boots_interleaving_are_a_duplicate_id_once_and_the_state_does_not_flap() -> None:
    clock = FakeClock()
    t = _fleet(clock, {"n": S})
    health = {"a": "healthy", "b": "unhealthy"}
    seen_health: list[str] = []
    duplicates: list[tuple[str, str]] = []
    ignored = 0
    for seq in range(10):
        for boot in ("a", "b"):
            hb = _hb("n", seq, S, boot_id=boot, health=health[boot])
            out = t.on_heartbeat(hb, clock.now_ms())
            ignored += out.ignored == "duplicate_id"
            if out.duplicate:
                duplicates.append(out.duplicate)
            seen_health.append(t.nodes["n"].health)
            clock.advance(S // 2)
    assert duplicates == [("b", "a")]  # one episode, one report
    assert ignored == 9
    # b took over at its first heartbeat and the state stayed there: one flip, no flapping.
    assert seen_health == ["healthy"] + ["unhealthy"] * 19
    assert t.is_rival("n", "a", clock.now_ms()) and not t.is_rival("n", "b", clock.now_ms())


def test_the_other_boot_takes_over_when_ours_goes_silent_and_a_return_is_a_new_episode() -> None:
    clock = FakeClock()
    t = _fleet(clock, {"n": S})
    t.on_heartbeat(_hb("n", 1, S, boot_id="a"), clock.now_ms())
    t.on_heartbeat(_hb("n", 1, S, boot_id="b"), clock.now_ms())
    assert t.on_heartbeat(_hb("n", 2, S, boot_id="a"), clock.now_ms()).duplicate == ("b", "a")
    clock.advance(3 * S + 1)  # b silent for a window; a is still there
    takeover = t.on_heartbeat(_hb("n", 3, S, boot_id="a"), clock.now_ms())
    assert takeover.ignored is None and t.nodes["n"].boot_id == "a"
    clock.advance(S)
    back = t.on_heartbeat(_hb("n", 2, S, boot_id="b"), clock.now_ms())
    assert (back.ignored, back.duplicate) == ("duplicate_id", ("a", "b"))
