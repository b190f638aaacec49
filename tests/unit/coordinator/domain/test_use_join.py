"""The join of promise and use (SPEC §10): examples for each transition, and a stateful
hypothesis machine that drives bookings, processes and time against a plain reference
model of what must be said when."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from coordinator.domain.gpu_use_conditions import changes, key_of, state_of
from coordinator.domain.gpu_use_join import Idle, JoinState, UseTransition, join
from coordinator.domain.gpu_use_units import Hold, Policy, unbooked_units
from shared.clock import FakeClock
from shared.wire import DeviceUse, ProcessUse

NODE, POOL = "n1", "pool-a"
UNITS = ("GPU-0", "GPU-1", "GPU-2")
POLICY = Policy(idle_after_ms=60_000, idle_util_percent=10)


def hold(rid: str, *units: str, tenant: str = "acme", cls: str = "gpu") -> Hold:
    return Hold(rid, tenant, None, POOL, NODE, cls, units, 0, 10**13)


def proc(pid: int, owner: str = "", kind: str = "unknown", util: int | None = None) -> ProcessUse:
    return ProcessUse(pid=pid, owner=owner, owner_kind=kind, sm_util=util)  # type: ignore[arg-type]


def use(unit: str, *procs: ProcessUse, util: int | None = 50) -> DeviceUse:
    return DeviceUse(device_id=unit, sm_util=util if procs else 0, processes=procs)


def run(
    state: JoinState, devices: list[DeviceUse], holds: list[Hold], now: int, **kw: object
) -> tuple[JoinState, list[UseTransition]]:
    uses = {NODE: {d.device_id: d for d in devices}}
    return join(state, uses, holds, {NODE: POOL}, now, POLICY, **kw)  # type: ignore[arg-type]


def test_a_process_on_an_unbooked_gpu_is_said_once_and_again_after_it_cleared() -> None:
    s, out = run(JoinState(), [use("GPU-0", proc(7, "pod-1", "pod"))], [], 0)
    assert [(t.kind, t.device_id, t.details["pids"]) for t in out] == [
        ("gpu.unbookedUse", "GPU-0", [7])
    ]
    s, out = run(s, [use("GPU-0", proc(7, "pod-1", "pod"))], [], 1000)
    assert out == []
    s, out = run(s, [use("GPU-0")], [], 2000)
    s, out = run(s, [use("GPU-0", proc(8))], [], 3000)
    assert [t.kind for t in out] == ["gpu.unbookedUse"]


def test_a_replica_that_judges_nothing_finds_the_units_the_join_marks_unbooked() -> None:
    devices = [use("GPU-0", proc(7, "pod-1", "pod")), use("GPU-1", proc(8, "r1")), use("GPU-2")]
    holds = [hold("r1", "GPU-1")]
    state, _ = run(JoinState(), devices, holds, 0)
    found = unbooked_units({NODE: {d.device_id: d for d in devices}}, holds)
    assert found == state.unbooked == {(NODE, "GPU-0")}


def test_a_booking_of_the_node_or_a_mig_instance_covers_its_units() -> None:
    whole = hold("rsv-node", *UNITS, cls="node")
    mig = hold("rsv-mig", "MIG-1", cls="gpu.mig")
    devices = [
        use("GPU-1", proc(1, "rsv-node", "reservation")),
        use("MIG-1", proc(2, "rsv-mig", "reservation")),
    ]
    _, out = run(JoinState(), devices, [whole, mig], 0)
    assert out == []


def test_a_process_of_another_reservation_is_foreign_and_says_whose_tenant() -> None:
    holds = [hold("rsv-a", "GPU-0"), hold("rsv-b", "GPU-1", tenant="globex")]
    devices = [use("GPU-0", proc(5, "rsv-b", "reservation"), proc(6, "rsv-a", "reservation"))]
    s, out = run(JoinState(), devices, holds, 0, tenant_of={"rsv-b": "globex"})
    assert len(out) == 1
    t = out[0]
    assert (t.kind, t.device_id, t.reservation_id) == ("gpu.foreignUse", "GPU-0", "rsv-b")
    assert t.details["otherTenant"] is True and t.details["holders"] == ["rsv-a"]
    assert t.details["pids"] == [5]
    _, again = run(s, devices, holds, 1000, tenant_of={"rsv-b": "globex"})
    assert again == []


def test_a_pod_on_a_booked_gpu_is_foreign_once_per_owner_while_it_lasts() -> None:
    """The usual intruder: a pod a scheduler put on a booked GPU names no reservation."""
    holds = [hold("rsv-a", "GPU-0")]
    devices = [use("GPU-0", proc(5, "pod-9", "pod"), proc(6, "rsv-a", "reservation"))]
    s, out = run(JoinState(), devices, holds, 0)
    assert [(t.kind, t.device_id, t.reservation_id) for t in out] == [
        ("gpu.foreignUse", "GPU-0", None)
    ]
    d = out[0].details
    assert (d["owner"], d["ownerKind"], d["holders"], d["pids"]) == ("pod-9", "pod", ["rsv-a"], [5])
    assert d["holderTenantIds"] == ["acme"] and d["ownerTenantId"] is None
    assert d["otherTenant"] is None  # a pod's tenant is not known
    s, again = run(s, devices, holds, 1000)
    assert again == []
    # Another intruder on the same GPU is said too; the first is not said again.
    more = [use("GPU-0", proc(5, "pod-9", "pod"), proc(7, "42", "slurm"))]
    s, out = run(s, more, holds, 2000)
    assert [(t.details["ownerKind"], t.details["owner"]) for t in out] == [("slurm", "42")]
    # Gone, then back: said again.
    s, out = run(s, [use("GPU-0")], holds, 3000)
    s, out = run(s, more, holds, 4000)
    assert sorted(t.details["ownerKind"] for t in out) == ["pod", "slurm"]


def test_a_process_nobody_owns_on_a_booked_gpu_is_foreign_once_for_all_of_them() -> None:
    holds = [hold("rsv-a", "GPU-0", "GPU-1", cls="node")]
    devices = [use("GPU-1", proc(5), proc(6))]
    s, out = run(JoinState(), devices, holds, 0)
    assert [(t.kind, t.device_id) for t in out] == [("gpu.foreignUse", "GPU-1")]
    d = out[0].details
    assert (d["owner"], d["ownerKind"], d["pids"]) == ("", "unknown", [5, 6])
    assert "no known owner" in out[0].reason
    _, again = run(s, [use("GPU-1", proc(5), proc(6), proc(8))], holds, 1000)
    assert again == []


def test_a_container_or_unit_on_a_booked_gpu_is_foreign() -> None:
    devices = [use("GPU-0", proc(5, "ab" * 32, "container"), proc(6, "x.service", "systemd"))]
    _, out = run(JoinState(), devices, [hold("rsv-a", "GPU-0")], 0)
    assert sorted(t.details["ownerKind"] for t in out) == ["container", "systemd"]


def test_the_holder_s_own_processes_are_never_foreign() -> None:
    """A holder's process carries its reservation in its environment (a Slurm job through
    the TaskProlog's `GPUFLEET_RESERVATION_ID`, docs/operator.md): it is the holder's,
    on a GPU, a time-slice slot, a MIG instance or a whole node it holds."""
    holds = [
        hold("rsv-a", "GPU-0"),
        hold("rsv-s1", "GPU-1", cls="gpu.slot"),
        hold("rsv-s2", "GPU-1", cls="gpu.slot"),
        hold("rsv-m", "MIG-1", cls="gpu.mig"),
        hold("rsv-n", "GPU-2", cls="node"),
    ]
    devices = [
        use("GPU-0", proc(1, "rsv-a", "reservation"), proc(2, "rsv-a", "reservation")),
        use("GPU-1", proc(3, "rsv-s1", "reservation"), proc(4, "rsv-s2", "reservation")),
        use("MIG-1", proc(5, "rsv-m", "reservation"), util=None),
        use("GPU-2", proc(6, "rsv-n", "reservation")),
    ]
    _, out = run(JoinState(), devices, holds, 0)
    assert out == []


def test_a_gpu_slurm_chose_inside_a_booking_is_that_booking_s() -> None:
    """Slurm picks which of the node's GPUs a job in a booking's reservation gets: the
    ledger booked GPU-0, the job runs on GPU-1. That is the booking's use (no unbooked
    alert, not idle), still busy for placement; a stranger joining it makes it unbooked."""
    holds = [hold("rsv-a", "GPU-0")]
    job = use("GPU-1", proc(1, "rsv-a", "reservation", util=90), util=90)
    s, out = run(JoinState(), [job, use("GPU-0")], holds, 0)
    s, out2 = run(s, [job, use("GPU-0")], holds, 120_000)
    assert out == out2 == []
    assert s.chosen == {(NODE, "GPU-1")} and s.unbooked == frozenset()
    assert s.idle["rsv-a"].since is None  # working, by the GPU Slurm chose
    # Another reservation's process (or one on a node it holds nothing on) is not it.
    other = use("GPU-1", proc(1, "rsv-a", "reservation"), proc(2, "rsv-b", "reservation"))
    _, out = run(s, [other, use("GPU-0")], holds, 130_000)
    assert [t.kind for t in out] == ["gpu.unbookedUse"]


def test_an_idle_reservation_is_said_after_the_threshold_and_in_use_when_it_works() -> None:
    holds = [hold("rsv-a", "GPU-0", "GPU-1", cls="node")]
    low = [use("GPU-0", proc(1, "rsv-a", "reservation", util=3), util=3), use("GPU-1")]
    s, out = run(JoinState(), low, holds, 0)
    assert out == []
    s, out = run(s, low, holds, 59_999)
    assert out == []
    s, out = run(s, low, holds, 60_000)
    assert [(t.kind, t.reservation_id, t.details["idleSince"]) for t in out] == [
        ("reservation.idle", "rsv-a", 0)
    ]
    s, out = run(s, low, holds, 120_000)
    assert out == []
    s, out = run(
        s, [use("GPU-1", proc(2, "rsv-a", "reservation", util=None), util=None)], holds, 121_000
    )
    assert [(t.kind, t.reservation_id) for t in out] == [("reservation.inUse", "rsv-a")]


def test_a_reservation_that_ends_while_idle_clears_its_idleness() -> None:
    holds = [hold("rsv-a", "GPU-0")]
    s, _ = run(JoinState(), [use("GPU-0")], holds, 0)
    s, out = run(s, [use("GPU-0")], holds, 60_000)
    assert [t.kind for t in out] == ["reservation.idle"]
    # Held on a node not judged this pass: still live, nothing said.
    same, out = run(s, [use("GPU-0")], [], 61_000, spread={"rsv-a": frozenset({"n2"})})
    assert out == [] and same.idle["rsv-a"].said
    _, out = run(s, [use("GPU-0")], [], 62_000)
    assert [(t.kind, t.reservation_id, t.node_id, t.details["ended"]) for t in out] == [
        ("reservation.inUse", "rsv-a", NODE, True)
    ]


def test_a_reservation_with_a_node_whose_use_is_not_current_is_not_judged() -> None:
    holds = [hold("rsv-a", "GPU-0")]
    spread = {"rsv-a": frozenset({NODE, "n2"})}
    s, _ = run(JoinState(), [use("GPU-0")], holds, 0, spread=spread)
    s, out = run(s, [use("GPU-0")], holds, 120_000, spread=spread)
    assert out == [] and s.idle["rsv-a"].since is None


def test_a_mig_instance_with_no_utilization_figure_is_not_judged_idle() -> None:
    """NVML gives no utilization for a MIG instance: a process on it is neither working
    nor idle. No idle clock runs however long it lasts; an idle said before (no process)
    is taken back, saying why; with no process again, it is idle again."""
    holds = [hold("rsv-m", "MIG-1", cls="gpu.mig")]
    unknown = [use("MIG-1", proc(1, "rsv-m", "reservation"), util=None)]
    s, _ = run(JoinState(), unknown, holds, 0)
    s, out = run(s, unknown, holds, 10 * 60_000)
    assert out == [] and s.idle["rsv-m"] == Idle(
        None, False, POOL, NODE, judged=False, tenant_id="acme"
    )
    s, _ = run(s, [use("MIG-1")], holds, 11 * 60_000)
    s, out = run(s, [use("MIG-1")], holds, 12 * 60_000)
    assert [t.kind for t in out] == ["reservation.idle"]
    s, out = run(s, unknown, holds, 13 * 60_000)
    assert [(t.kind, t.details.get("notJudged")) for t in out] == [("reservation.inUse", True)]
    # A GPU of the same reservation at work makes it working, judged.
    both = [*holds, hold("rsv-m", "GPU-0")]
    s, _ = run(
        s,
        [*unknown, use("GPU-0", proc(2, "rsv-m", "reservation", util=60), util=60)],
        both,
        14 * 60_000,
    )
    assert s.idle["rsv-m"].judged


def test_a_slot_holder_is_idle_by_its_own_processes_not_the_other_holder_s() -> None:
    """R0 and R1 each hold a time-slice slot of GPU-0; R0's process works at 80 %: R1,
    with no process, is idle after the threshold, R0 never; a process nobody owns at
    work counts for R1 (it may be R1's), then R1 is in use."""
    holds = [hold("rsv-0", "GPU-0", cls="gpu.slot"), hold("rsv-1", "GPU-0", cls="gpu.slot")]
    r0 = proc(1, "rsv-0", "reservation", util=80)
    s, _ = run(JoinState(), [use("GPU-0", r0, util=80)], holds, 0)
    s, out = run(s, [use("GPU-0", r0, util=80)], holds, 60_000)
    assert [(t.kind, t.reservation_id) for t in out] == [("reservation.idle", "rsv-1")]
    s, out = run(s, [use("GPU-0", r0, proc(2, "pod-1", "pod", util=30), util=100)], holds, 61_000)
    assert [(t.kind, t.reservation_id) for t in out] == [
        ("gpu.foreignUse", None),  # the pod is no holder's: said, and counted for R1
        ("reservation.inUse", "rsv-1"),
    ]


# -- the machine -----------------------------------------------------------------------

OWNERS = ("", "rsv-0", "rsv-1", "rsv-2", "pod-x")


class JoinMachine(RuleBasedStateMachine):
    """Bookings come and go on three GPUs, processes start and stop, time moves; after
    each pass what was said matches a reference model that keeps, per condition, only
    whether it holds and whether it was said."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock(0)
        self.state = JoinState()
        self.holders: dict[str, str] = {}  # unit → reservation (one holder each)
        self.procs: dict[str, list[tuple[str, int]]] = {u: [] for u in UNITS}  # owner, util
        # The reference: what holds now, and what has been said and not cleared.
        self.said_unbooked: set[str] = set()
        self.said_foreign: set[tuple[str, str]] = set()
        self.idle_since: dict[str, int] = {}
        self.said_idle: set[str] = set()
        self.log: list[UseTransition] = []

    @rule(unit=st.sampled_from(UNITS), rid=st.sampled_from(("rsv-0", "rsv-1", "rsv-2")))
    def book(self, unit: str, rid: str) -> None:
        self.holders[unit] = rid

    @rule(unit=st.sampled_from(UNITS))
    def release(self, unit: str) -> None:
        self.holders.pop(unit, None)

    @rule(
        unit=st.sampled_from(UNITS),
        owner=st.sampled_from(OWNERS),
        util=st.integers(0, 100),
    )
    def start_process(self, unit: str, owner: str, util: int) -> None:
        if len(self.procs[unit]) < 3:
            self.procs[unit].append((owner, util))

    @rule(unit=st.sampled_from(UNITS))
    def stop_processes(self, unit: str) -> None:
        self.procs[unit] = []

    @rule(ms=st.integers(0, 90_000))
    def pass_(self, ms: int) -> None:
        self.clock.advance(ms)
        now = self.clock.now_ms()
        by_rid: dict[str, list[str]] = {}
        for unit, rid in sorted(self.holders.items()):
            by_rid.setdefault(rid, []).append(unit)
        holds = [hold(rid, *units) for rid, units in sorted(by_rid.items())]
        devices = []
        for unit in UNITS:
            procs = tuple(
                proc(
                    i + 1, o, "reservation" if o.startswith("rsv") else ("pod" if o else "unknown")
                )
                for i, (o, _) in enumerate(self.procs[unit])
            )
            util = max((u for _, u in self.procs[unit]), default=0)
            devices.append(DeviceUse(device_id=unit, sm_util=util, processes=procs))
        self.state, out = run(self.state, devices, holds, now)
        self.log.extend(out)
        self._expect(out, now, by_rid)

    def _expect(self, out: list[UseTransition], now: int, by_rid: dict[str, list[str]]) -> None:
        want: list[tuple[str, str | None, str | None]] = []
        # A unit no booking covers used by one booking's processes alone: Slurm's choice.
        chosen = {
            u: owners.pop()
            for u in UNITS
            if self.procs[u] and u not in self.holders
            for owners in [{o for o, _ in self.procs[u]}]
            if len(owners) == 1 and next(iter(owners)) in by_rid
        }
        unbooked = {u for u in UNITS if self.procs[u] and u not in self.holders} - set(chosen)
        want += [("gpu.unbookedUse", u, None) for u in sorted(unbooked - self.said_unbooked)]
        # A condition: what no longer holds ends.
        want += [("gpu.unbookedUseEnded", u, None) for u in sorted(self.said_unbooked - unbooked)]
        self.said_unbooked = unbooked
        foreign = {
            (u, o)
            for u in UNITS
            if u in self.holders
            for o, _ in self.procs[u]
            if o != self.holders[u]
        }
        want += [
            ("gpu.foreignUse", u, o if o.startswith("rsv") else None)
            for u, o in sorted(foreign - self.said_foreign)
        ]
        want += [
            ("gpu.foreignUseEnded", u, o if o.startswith("rsv") else None)
            for u, o in sorted(self.said_foreign - foreign)
        ]
        self.said_foreign = foreign
        for rid in sorted(by_rid):
            units = by_rid[rid] + [u for u, r in chosen.items() if r == rid]
            working = any(
                util >= POLICY.idle_util_percent for u in units for _, util in self.procs[u]
            )
            if working:
                self.idle_since.pop(rid, None)
                if rid in self.said_idle:
                    self.said_idle.discard(rid)
                    want.append(("reservation.inUse", None, rid))
                continue
            since = self.idle_since.setdefault(rid, now)
            if rid not in self.said_idle and now - since >= POLICY.idle_after_ms:
                self.said_idle.add(rid)
                want.append(("reservation.idle", None, rid))
        for rid in set(self.idle_since) - set(by_rid):
            del self.idle_since[rid]
        for rid in self.said_idle - set(by_rid):
            self.said_idle.discard(rid)  # released while idle: its idleness ends too
            want.append(("reservation.inUse", None, rid))
        got = [(t.kind, t.device_id, t.reservation_id) for t in out]
        assert sorted(got, key=str) == sorted(want, key=str)

    @rule()
    def leader_change(self) -> None:
        """A new leader goes on from the conditions said and not ended, as the ledger
        keeps them (`gpu_use_conditions`): it says none of them again and ends each once;
        idle clocks not yet said start afresh."""
        opened, _ = changes(self.log, self.clock.now_ms())
        self.state = state_of(opened)
        self.idle_since = {r: t for r, t in self.idle_since.items() if r in self.said_idle}

    @invariant()
    def starts_and_ends_alternate(self) -> None:
        last: dict[str, str] = {}
        for t in self.log:
            key = key_of(t)
            assert last.get(key) != t.kind, t
            last[key] = t.kind

    @invariant()
    def idle_and_in_use_alternate(self) -> None:
        last: dict[str, str] = {}
        for t in self.log:
            if t.kind in ("reservation.idle", "reservation.inUse"):
                assert t.reservation_id is not None
                assert last.get(t.reservation_id) != t.kind
                last[t.reservation_id] = t.kind


JoinMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)
test_join_machine = JoinMachine.TestCase


def test_use_alerts_carry_the_owner_s_readable_name_where_the_agent_read_one() -> None:
    pod = ProcessUse(pid=7, owner="uid-1", owner_kind="pod", owner_name="ml/train-0")
    job = ProcessUse(pid=8, owner="42", owner_kind="slurm", owner_name="alice")
    _, out = run(
        JoinState(), [use("GPU-0", pod), use("GPU-1", proc(9, rid := "rsv-1", "reservation"), job)],
        [hold(rid, "GPU-1")], 0,
    )  # fmt: skip
    by_kind = {t.kind: t for t in out}
    assert by_kind["gpu.unbookedUse"].details["owners"] == [
        {"pid": 7, "owner": "uid-1", "ownerKind": "pod", "ownerName": "ml/train-0"}
    ]
    foreign = by_kind["gpu.foreignUse"]
    assert (foreign.details["owner"], foreign.details["ownerName"]) == ("42", "alice")
