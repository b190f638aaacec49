"""Use in heartbeats: noise settled, changes against the last version sent, a byte
budget (a typical 8-GPU heartbeat < 1 KiB) with a full UseReport beyond it, and a
receiver that applies them never holding a state the agent did not have."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from agent.use_changes import HEARTBEAT_BUDGET, UTIL_HOLD_S, UseChanges, UseDelta, settle
from coordinator.domain.gpu_use_units import Policy, busy
from shared.wire import DeviceUse, Heartbeat, NodeHealth, ProcessUse
from tests.unit.agent.test_usage import RSV, Host, booked

HB = Heartbeat(
    node_id="gpu-node-0001.rack07.example",
    pool_id="pool_01jabcdefghjkmnpqrstvwxyz0",
    boot_id="6b8a0f0b-7a8c-4d9e-9f1e-2c3b4a5d6e7f/0a1b2c3d",
    seq=1_000_000,
    sent_at=1_767_225_600_000,
    interval_ms=5000,
    inventory_hash="a" * 64,
    health=NodeHealth(status="healthy"),
)


def dev(
    uuid: str = "GPU-1", sm: int | None = 0, mem: int | None = 0, *procs: ProcessUse
) -> DeviceUse:
    return DeviceUse(
        device_id=uuid, sm_util=sm, memory_util=sm, memory_used_mib=mem, processes=procs
    )


def proc(pid: int, mem: int = 1000, sm: int | None = 50, owner: str = RSV) -> ProcessUse:
    return ProcessUse(
        pid=pid, used_memory_mib=mem, owner=owner, owner_kind="reservation", sm_util=sm
    )


def test_utilization_is_sent_as_read_moving_ten_points_or_across_idle() -> None:
    first = settle(None, dev(sm=43))
    assert first.sm_util == 43
    assert settle(first, dev(sm=51)).sm_util == 43  # 8 points: noise
    assert settle(first, dev(sm=34)).sm_util == 43
    assert settle(first, dev(sm=53)).sm_util == 53
    low = settle(None, dev(sm=6))
    assert low.sm_util == 6 and settle(low, dev(sm=0)).sm_util == 0  # idle is a change
    assert settle(settle(None, dev(sm=0)), dev(sm=3)).sm_util == 0  # idle noise
    assert settle(low, dev(sm=None)).sm_util is None  # unknown is a change


def _settled(readings: list[int], every_s: float = 5.0) -> list[int | None]:
    """The settled SM utilization after each reading, one each `every_s`."""
    use, out = UseChanges(), []
    for i, sm in enumerate(readings):
        use.observe([dev("GPU-1", sm, 0, proc(7, sm=sm))], now=i * every_s)
        (settled,) = use.current
        out.append(settled.sm_util)
    return out


def test_a_constant_4_percent_is_idle_to_the_coordinator() -> None:
    """Found: rounded to 5 % steps, a booking at a constant 4 % read as 5 %, never idle
    under the default "under 5 %" threshold."""
    use = UseChanges()
    for i in range(10):
        use.observe([dev("GPU-1", 4, 0, proc(7, sm=4))], now=i * 5.0)
    (settled,) = use.current
    assert settled.sm_util == 4 and settled.processes[0].sm_util == 4
    assert not busy(settled, Policy())


def test_a_crossing_of_the_idle_threshold_is_always_a_change() -> None:
    assert _settled([15, 4]) == [15, 4]  # 11 points, and under the threshold
    assert _settled([12, 4]) == [12, 4]  # 8 points only: the crossing counts
    assert _settled([4, 6]) == [4, 6]
    use = UseChanges(idle_util_percent=20)  # a coordinator set to "under 20 %"
    use.observe([dev("GPU-1", 24)], now=0)
    use.observe([dev("GPU-1", 17)], now=5)
    assert use.current[0].sm_util == 17


def test_a_held_value_is_refreshed_after_the_hold_time() -> None:
    """Found: after a 15 % burst, 6 % stayed "15" for good."""
    seen = _settled([15] + [6] * 30)  # 150 s of 6 % after the burst
    assert seen[1] == 15  # 9 points, both over the threshold: noise at first
    assert seen[-1] == 6
    assert (seen.index(6) - 1) * 5.0 <= UTIL_HOLD_S  # held from the first 6 on
    steady = _settled([50, 52, 48, 51] * 20)  # noise within a point or two
    assert len(set(steady)) <= 1 + 20 * 20 * 5.0 / UTIL_HOLD_S  # at most one per hold


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 100), min_size=1, max_size=40), st.integers(0, 100))
def test_the_settled_value_is_on_the_raw_values_side_of_the_threshold(
    raw: list[int], threshold: int
) -> None:
    use = UseChanges(idle_util_percent=threshold)
    for i, sm in enumerate(raw):
        use.observe([dev("GPU-1", sm, 0, proc(7, sm=sm))], now=i * 5.0)
        (settled,) = use.current
        assert settled.sm_util is not None and settled.processes[0].sm_util is not None
        assert (settled.sm_util < threshold) == (sm < threshold)
        assert (settled.processes[0].sm_util < threshold) == (sm < threshold)
        assert busy(settled, Policy(idle_util_percent=threshold)) == (sm >= threshold)


def test_memory_moves_in_steps_of_256_mib_and_processes_always_count() -> None:
    first = settle(None, dev("GPU-1", 0, 1000, proc(1, 5000)))
    again = settle(first, dev("GPU-1", 0, 1200, proc(1, 5200, sm=55)))
    assert again == first
    grown = settle(first, dev("GPU-1", 0, 1300, proc(1, 5300)))
    assert (grown.memory_used_mib, grown.processes[0].used_memory_mib) == (1300, 5300)
    assert settle(first, dev("GPU-1", 0, 1000)).processes == ()
    other = settle(first, dev("GPU-1", 0, 1000, proc(1, 5000, owner="rsv_other")))
    assert other.processes[0].owner == "rsv_other"


def test_versions_count_settled_changes_and_deltas_hold_only_what_changed() -> None:
    use = UseChanges()
    assert not use.observe([], now=0)
    assert use.observe([dev("GPU-1"), dev("GPU-2")], now=0) and use.version == 1
    assert not use.observe([dev("GPU-1", sm=2), dev("GPU-2")], now=5)  # noise: same version
    use.sent(use.full())
    assert use.delta() == UseDelta(1, 1, (), use.delta().state)
    use.observe([dev("GPU-1", 80, 0, proc(7)), dev("GPU-2")], now=10)
    delta = use.delta()
    assert (delta.base, delta.version) == (1, 2)
    assert [d.device_id for d in delta.devices] == ["GPU-1"]
    use.sent(delta)
    use.observe([dev("GPU-1", 80, 0, proc(7))], now=15)  # GPU-2 is no longer read
    gone = use.delta()
    assert gone.devices == (DeviceUse(device_id="GPU-2"),)
    use.sent(gone)
    assert use.delta().devices == ()


def test_changes_beyond_the_budget_go_as_a_report() -> None:
    use = UseChanges()
    use.observe([dev(f"GPU-{i:036d}", 0, 0) for i in range(8)], now=0)
    plan = use.plan(HB)
    assert plan.report is not None and plan.inline is None
    assert len(plan.report.devices) == 8 and plan.report.version == 1
    hb = plan.heartbeat
    assert (hb.use, hb.use_base, hb.use_version) == ((), 1, 1)
    use.sent(plan.report)
    use.observe([dev(f"GPU-{i:036d}", 90 if i == 3 else 0, 0) for i in range(8)], now=5)
    small = use.plan(HB)
    assert small.report is None and len(small.heartbeat.use) == 1
    assert (small.heartbeat.use_base, small.heartbeat.use_version) == (1, 2)


def test_a_report_not_sent_leaves_the_heartbeat_at_the_last_version_sent() -> None:
    use = UseChanges()
    use.observe([dev(f"GPU-{i:036d}", 0, 0) for i in range(8)], now=0)
    plan = use.plan(HB)
    assert plan.report is not None
    bare = use.plan_without(HB).heartbeat  # what the publisher sends when it failed
    assert (bare.use, bare.use_base, bare.use_version) == ((), 0, 0)
    again = use.plan(HB)  # not acknowledged: the next heartbeat tries the report again
    assert again.report is not None and again.report.version == 1


def test_a_typical_8_gpu_heartbeat_stays_under_1_kib(tmp_path: Path) -> None:
    """The H100 host with four workloads, one of them a square wave: after the first
    report, every heartbeat carries its changes inline and stays under 1 KiB."""
    host = Host(tmp_path, "h100-sxm-8")
    square = {"shape": "square", "low": 5, "high": 95, "period_s": 60}
    ramp = {"shape": "ramp", "from": 0, "to": 100, "period_s": 300}
    host.run(
        booked(100, [0, 1]),
        booked(101, [2], util=square),
        booked(102, [5], util=ramp),
        {"kind": "process", "pid": 103, "gpu": 7, "memory_mib": 512},  # unbooked, idle
    )
    use = UseChanges()
    reports, inline, sizes = 0, 0, []
    for _ in range(120):  # ten minutes at the 5 s interval
        use.observe(host.read().values(), now=host.clock.monotonic())
        plan = use.plan(HB)
        sizes.append(len(plan.heartbeat.to_json()))
        reports += plan.report is not None
        inline += bool(plan.heartbeat.use)
        use.sent(plan.report or plan.inline)  # type: ignore[arg-type]
        host.clock.advance(5000)
    assert max(sizes) < HEARTBEAT_BUDGET, sizes
    assert reports == 1 and inline > 10  # the start, then changes in the heartbeats


class Receiver:
    """What a coordinator does with them: apply a heartbeat's changes on the version it
    holds, or take a full report when its version is not the heartbeat's base."""

    def __init__(self) -> None:
        self.version = 0
        self.state: dict[str, DeviceUse] = {}
        self.asked = 0

    def report(self, delta: UseDelta) -> None:
        self.version, self.state = delta.version, {d.device_id: d for d in delta.devices}

    def heartbeat(self, hb: Heartbeat, agent: UseChanges) -> None:
        if hb.use_base != self.version:
            self.asked += 1
            self.report(agent.full())  # the agent answers a use request
            return
        self.state |= {d.device_id: d for d in hb.use}
        self.version = hb.use_version


def _known(state: dict[str, DeviceUse]) -> dict[str, DeviceUse]:
    """A device sent as wholly unknown is as good as absent."""
    return {k: d for k, d in state.items() if d != DeviceUse(device_id=k)}


readings = st.lists(
    st.lists(
        st.tuples(st.integers(0, 4), st.integers(0, 100), st.integers(0, 3)),
        max_size=5,
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=150, deadline=None)
@given(readings, st.lists(st.booleans(), min_size=60, max_size=60))
def test_a_receiver_holds_the_agents_state_or_asks(steps: list[Any], drops: list[bool]) -> None:
    agent, receiver = UseChanges(budget=700), Receiver()
    lost = iter(drops + [False] * 100)
    for i, step in enumerate(steps):
        devices = {
            f"GPU-{g}": dev(f"GPU-{g}", sm, 0, *(proc(p) for p in range(n))) for g, sm, n in step
        }
        agent.observe(devices.values(), now=i * 5.0)
        plan = agent.plan(HB)
        if plan.report is not None:
            agent.sent(plan.report)
            if not next(lost):
                receiver.report(plan.report)
        if plan.inline is not None:
            agent.sent(plan.inline)
        if not next(lost):
            receiver.heartbeat(plan.heartbeat, agent)
            # Never a wrong state: after any heartbeat it holds the agent's.
            assert receiver.version == agent.version
            assert _known(receiver.state) == _known(dict((d.device_id, d) for d in agent.current))
