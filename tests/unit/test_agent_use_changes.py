"""Use in heartbeats: noise settled, changes against the last version sent, a byte
budget (a typical 8-GPU heartbeat < 1 KiB) with a full UseReport beyond it, and a
receiver that applies them never holding a state the agent did not have."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from agent.use_changes import HEARTBEAT_BUDGET, UseChanges, UseDelta, grain, settle
from shared.wire import DeviceUse, Heartbeat, NodeHealth, ProcessUse
from tests.unit.test_agent_usage import RSV, Host, booked

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


def test_utilization_in_steps_of_five_moving_ten_points_or_to_zero() -> None:
    assert [grain(v) for v in (0, 2, 3, 7, 8, 99, 100)] == [0, 0, 5, 5, 10, 100, 100]
    first = settle(None, dev(sm=43))
    assert first.sm_util == 45
    assert settle(first, dev(sm=51)).sm_util == 45  # 6 points from 45: noise
    assert settle(first, dev(sm=36)).sm_util == 45
    assert settle(first, dev(sm=55)).sm_util == 55
    low = settle(None, dev(sm=6))
    assert low.sm_util == 5 and settle(low, dev(sm=0)).sm_util == 0  # idle is a change
    assert settle(low, dev(sm=None)).sm_util is None  # unknown is a change


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
    assert not use.observe([])
    assert use.observe([dev("GPU-1"), dev("GPU-2")]) and use.version == 1
    assert not use.observe([dev("GPU-1", sm=2), dev("GPU-2")])  # noise: same version
    use.sent(use.full())
    assert use.delta() == UseDelta(1, 1, (), use.delta().state)
    use.observe([dev("GPU-1", 80, 0, proc(7)), dev("GPU-2")])
    delta = use.delta()
    assert (delta.base, delta.version) == (1, 2)
    assert [d.device_id for d in delta.devices] == ["GPU-1"]
    use.sent(delta)
    use.observe([dev("GPU-1", 80, 0, proc(7))])  # GPU-2 is no longer read
    gone = use.delta()
    assert gone.devices == (DeviceUse(device_id="GPU-2"),)
    use.sent(gone)
    assert use.delta().devices == ()


def test_changes_beyond_the_budget_go_as_a_report() -> None:
    use = UseChanges()
    use.observe([dev(f"GPU-{i:036d}", 0, 0) for i in range(8)])
    plan = use.plan(HB)
    assert plan.report is not None and plan.inline is None
    assert len(plan.report.devices) == 8 and plan.report.version == 1
    hb = plan.heartbeat
    assert (hb.use, hb.use_base, hb.use_version) == ((), 1, 1)
    use.sent(plan.report)
    use.observe([dev(f"GPU-{i:036d}", 90 if i == 3 else 0, 0) for i in range(8)])
    small = use.plan(HB)
    assert small.report is None and len(small.heartbeat.use) == 1
    assert (small.heartbeat.use_base, small.heartbeat.use_version) == (1, 2)


def test_a_report_not_sent_leaves_the_heartbeat_at_the_last_version_sent() -> None:
    use = UseChanges()
    use.observe([dev(f"GPU-{i:036d}", 0, 0) for i in range(8)])
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
        use.observe(host.read().values())
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
    for step in steps:
        devices = {
            f"GPU-{g}": dev(f"GPU-{g}", sm, 0, *(proc(p) for p in range(n))) for g, sm, n in step
        }
        agent.observe(devices.values())
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
