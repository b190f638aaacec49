"""What the join of promise and use says, word for word (issue 31's mutation run): the
pool, node, reason and details of each use alert and of its end, the metrics' unit
lines, which holds are live, and idleness at the threshold, on shared units and on
nodes not judged."""

from __future__ import annotations

from coordinator.domain.gpu_use_join import Idle, JoinState, join
from coordinator.domain.gpu_use_units import Hold, Policy, UnitLine, shares, unit_lines, utilization
from shared.wire import DeviceUse, ProcessUse
from tests.unit.coordinator.domain.test_use_join import NODE, POLICY, POOL, hold, proc, run, use


def test_unbooked_use_and_its_end_name_the_pool_the_node_and_the_owners() -> None:
    named = ProcessUse(pid=7, owner="uid-1", owner_kind="pod", owner_name="ml/train-0")
    s, out = run(JoinState(), [use("GPU-0", named, proc(8))], [], 0)
    (t,) = out
    assert (t.kind, t.pool_id, t.node_id, t.device_id) == ("gpu.unbookedUse", POOL, NODE, "GPU-0")
    assert t.reason == "2 process(es) on a GPU no live booking covers"
    assert t.details["owners"][1] == {"pid": 8, "owner": "", "ownerKind": "unknown"}
    _, out = run(s, [use("GPU-0")], [], 1000)
    assert [(t.kind, t.pool_id, t.node_id, t.device_id, t.reason) for t in out] == [
        ("gpu.unbookedUseEnded", POOL, NODE, "GPU-0",
         "no process on the GPU any more, or a live booking covers it now"),
    ]  # fmt: skip


def test_foreign_use_and_its_end_name_the_owner_the_holders_and_their_tenants() -> None:
    holds = [hold("rsv-a", "GPU-0"), hold("rsv-c", "GPU-0", cls="gpu.slot")]
    tenants = {"rsv-b": "acme"}
    devices = [use("GPU-0", proc(5, "rsv-b", "reservation"))]
    s, out = run(JoinState(), devices, holds, 0, tenant_of=tenants)
    (t,) = out
    assert (t.kind, t.pool_id, t.node_id, t.reservation_id) == (
        "gpu.foreignUse", POOL, NODE, "rsv-b",
    )  # fmt: skip
    assert t.reason == "a process of reservation rsv-b on a GPU held by rsv-a, rsv-c"
    assert t.details["holderTenants"] == {"rsv-a": "acme", "rsv-c": "acme"}
    assert t.details["otherTenant"] is False  # the holders' own tenant
    _, out = run(s, [use("GPU-0")], holds, 1000, tenant_of=tenants)
    (end,) = out
    assert (end.kind, end.pool_id, end.node_id, end.device_id, end.reservation_id) == (
        "gpu.foreignUseEnded", POOL, NODE, "GPU-0", "rsv-b",
    )  # fmt: skip
    assert end.reason == "the process no longer runs on the GPU, or its holders changed"
    assert end.details == {
        "owner": "rsv-b", "ownerKind": "reservation", "ownerTenantId": "acme",
        "holders": ["rsv-a", "rsv-c"], "holderTenantIds": ["acme"],
        "holderTenants": {"rsv-a": "acme", "rsv-c": "acme"},
    }  # fmt: skip


def test_a_foreign_use_s_reason_says_who_owns_the_process() -> None:
    holds = [hold("rsv-a", "GPU-0")]
    procs = [
        ProcessUse(pid=1, owner="42", owner_kind="slurm", owner_name=""),
        ProcessUse(pid=2, owner="42", owner_kind="slurm", owner_name="alice"),
        proc(3, "", "pod"),
        proc(4, "rsv-z", "reservation"),  # a reservation no tenant is known for
    ]
    _, out = run(JoinState(), [use("GPU-0", *procs)], holds, 0)
    by_kind = {t.details["ownerKind"]: t for t in out}
    assert by_kind["slurm"].reason == "a process of slurm 42 on a GPU held by rsv-a"
    assert by_kind["slurm"].details["ownerName"] == "alice"
    assert by_kind["pod"].reason == "a process of no known owner on a GPU held by rsv-a"
    assert by_kind["reservation"].details["otherTenant"] is False


def test_a_process_of_a_reservation_on_another_s_gpu_on_its_node_is_foreign() -> None:
    """rsv-b holds GPU-1, and its process runs on GPU-0, which rsv-a holds: not Slurm's
    choice (that is a GPU no booking covers), but foreign use of rsv-a's GPU."""
    holds = [hold("rsv-a", "GPU-0"), hold("rsv-b", "GPU-1")]
    _, out = run(JoinState(), [use("GPU-0", proc(5, "rsv-b", "reservation"))], holds, 0)
    assert [(t.kind, t.reservation_id) for t in out] == [("gpu.foreignUse", "rsv-b")]


def test_slurm_s_choice_is_kept_while_its_node_is_not_judged_and_ends_when_it_is() -> None:
    """GPU-0 idle, GPU-1 Slurm's choice for rsv-a, GPU-2 a pod: each is judged."""
    holds = [hold("rsv-a", "GPU-5")]
    devices = [
        use("GPU-0"),
        use("GPU-1", proc(1, "rsv-a", "reservation")),
        use("GPU-2", proc(2, "pod-1", "pod")),
    ]
    s, out = run(JoinState(), devices, holds, 0)
    assert s.chosen == {(NODE, "GPU-1")}
    assert [(t.kind, t.device_id) for t in out] == [("gpu.unbookedUse", "GPU-2")]
    kept, _ = join(s, {"n2": {}}, holds, {NODE: POOL}, 1000, POLICY)
    assert kept.chosen == s.chosen and kept.unbooked == s.unbooked
    s, _ = run(s, [use("GPU-0"), use("GPU-1")], holds, 2000)
    assert s.chosen == frozenset()


def test_the_metrics_see_each_unit_of_the_nodes_judged() -> None:
    holds = [hold("rsv-b", "GPU-0", cls="gpu.slot"), hold("rsv-a", "GPU-0", cls="gpu.slot")]
    uses = {
        NODE: {
            "GPU-1": DeviceUse(device_id="GPU-1", sm_util=0),
            "GPU-0": use("GPU-0", proc(1, "rsv-a", "reservation"), proc(2, "p", "pod"), util=70),
        },
        "n2": {"GPU-9": DeviceUse(device_id="GPU-9", sm_util=None)},
    }
    assert unit_lines(uses, holds, {NODE: POOL}) == (
        UnitLine(NODE, POOL, "GPU-0", True, 70, ("rsv-a", "rsv-b"), ("rsv-a", "p"),
                 ("reservation", "pod"), ("", "")),
        UnitLine(NODE, POOL, "GPU-1", False, 0, (), (), (), ()),
        UnitLine("n2", "", "GPU-9", False, None, (), (), (), ()),
    )  # fmt: skip


def test_idleness_says_whose_where_and_against_what_threshold() -> None:
    holds = [hold("rsv-a", "GPU-0")]
    s, _ = run(JoinState(), [use("GPU-0")], holds, 0)
    _, out = run(s, [use("GPU-0")], holds, 60_000)
    (t,) = out
    assert (t.kind, t.pool_id, t.node_id) == ("reservation.idle", POOL, NODE)
    assert t.details == {"tenantId": "acme", "nodes": [NODE], "thresholdPercent": 10,
                         "idleSince": 0}  # fmt: skip


def test_only_live_holds_are_judged_idle_and_one_ending_now_has_ended() -> None:
    later = Hold("rsv-f", "acme", None, POOL, NODE, "gpu", ("GPU-1",), 10**6, 10**7)
    ending = Hold("rsv-e", "acme", None, POOL, NODE, "gpu", ("GPU-0",), 0, 200_000)
    s, _ = run(JoinState(), [use("GPU-0"), use("GPU-1")], [ending, later], 0)
    s, out = run(s, [use("GPU-0"), use("GPU-1")], [ending, later], 60_000)
    assert [(t.kind, t.reservation_id) for t in out] == [("reservation.idle", "rsv-e")]
    _, out = run(s, [use("GPU-0"), use("GPU-1")], [ending, later], 200_000)
    assert [(t.kind, t.reservation_id, t.details.get("ended")) for t in out] == [
        ("reservation.inUse", "rsv-e", True)
    ]


def test_a_reservation_on_a_node_not_judged_keeps_its_clock_and_the_others_go_on() -> None:
    holds = [hold("rsv-a", "GPU-0"), hold("rsv-b", "GPU-1")]
    spread = {"rsv-a": frozenset({NODE, "n2"})}
    s, _ = run(JoinState(), [use("GPU-0"), use("GPU-1")], holds, 0, spread=spread)
    assert s.idle["rsv-a"] == Idle(None, False) and s.idle["rsv-b"].since == 0


def test_use_at_the_threshold_is_work_on_a_sole_holder_s_gpu_and_on_a_shared_one() -> None:
    """Idle is "under the threshold"; a sole holder's GPU counts by the device's figure,
    whoever's process it is; a slot holder by its own processes."""
    policy = Policy(idle_after_ms=60_000, idle_util_percent=10)
    at = proc(1, "rsv-a", "reservation", util=10)
    slots = [hold("rsv-s", "GPU-1", cls="gpu.slot"), hold("rsv-t", "GPU-1", cls="gpu.slot")]
    holds = [hold("rsv-a", "GPU-0"), hold("rsv-p", "GPU-2"), *slots]
    devices = [
        use("GPU-0", at, util=10),
        use("GPU-1", proc(2, "rsv-s", "reservation", util=10), util=50),
        use("GPU-2", proc(3, "pod-1", "pod", util=3), util=50),
    ]
    s, _ = run(JoinState(), devices, holds, 0)
    s, out = run(s, devices, holds, policy.idle_after_ms)
    assert [t.reservation_id for t in out if t.kind == "reservation.idle"] == ["rsv-t"]
    assert s.idle["rsv-s"].judged and s.idle["rsv-s"].since is None


def test_a_slot_holder_s_process_with_no_figure_is_not_judged_and_an_absent_unit_is_idle() -> None:
    slots = [hold("rsv-s", "GPU-1", cls="gpu.slot"), hold("rsv-t", "GPU-1", cls="gpu.slot")]
    others = [hold("rsv-u", "GPU-2", cls="gpu.slot"), hold("rsv-v", "GPU-2", cls="gpu.slot")]
    devices = [use("GPU-1", proc(2, "rsv-s", "reservation"), util=None)]  # GPU-2 not reported
    s, _ = run(JoinState(), devices, slots + others, 0)
    s, out = run(s, devices, slots + others, 60_000)
    assert not s.idle["rsv-s"].judged and s.idle["rsv-s"].since is None
    assert sorted(t.reservation_id for t in out) == ["rsv-t", "rsv-u", "rsv-v"]


def test_idle_in_use_and_ended_say_whose_where_and_why() -> None:
    holds = [hold("rsv-a", "GPU-0")]
    s, _ = run(JoinState(), [use("GPU-0")], holds, 0)
    s, out = run(s, [use("GPU-0")], holds, 120_000)
    assert out[0].reason == "no process, or utilization under 10%, on any of its GPUs for 2 min"
    assert s.idle["rsv-a"] == Idle(0, True, POOL, NODE, tenant_id="acme")
    work = [use("GPU-0", proc(1, "rsv-a", "reservation", util=50))]
    _, out = run(s, work, holds, 130_000)
    assert [(t.pool_id, t.node_id, t.reason) for t in out] == [
        (POOL, NODE, "its GPUs are in use again")
    ]
    assert out[0].details == {"tenantId": "acme", "nodes": [NODE], "thresholdPercent": 10,
                              "idleSince": 0}  # fmt: skip
    unknown = [use("GPU-0", proc(1, "rsv-a", "reservation"), util=None)]
    _, out = run(s, unknown, holds, 130_000)
    assert out[0].reason == (
        "a process runs on a GPU with no utilization figure: idleness not judged"
    )
    assert out[0].details["notJudged"] is True and out[0].details["idleSince"] == 0
    # Two idle reservations end: each says so, with its tenant and since when.
    two = [*holds, hold("rsv-b", "GPU-1", tenant="globex")]
    s, _ = run(JoinState(), [use("GPU-0"), use("GPU-1")], two, 0)
    s, _ = run(s, [use("GPU-0"), use("GPU-1")], two, 60_000)
    _, out = run(s, [use("GPU-0"), use("GPU-1")], [], 70_000)
    assert [(t.reservation_id, t.pool_id, t.node_id, t.reason, t.details) for t in out] == [
        (rid, POOL, NODE, "the reservation ended",
         {"tenantId": tenant, "idleSince": 0, "ended": True})
        for rid, tenant in (("rsv-a", "acme"), ("rsv-b", "globex"))
    ]  # fmt: skip


def test_a_process_of_unknown_kind_has_no_known_owner_and_shares_cap_at_100() -> None:
    _, out = run(JoinState(), [use("GPU-0", proc(1, "x", "unknown"))], [hold("r", "GPU-0")], 0)
    assert out[0].reason == "a process of no known owner on a GPU held by r"
    both = use("GPU-0", proc(1, "r", "reservation", util=70), proc(2, "r", "reservation", util=60))
    assert shares(["r", "q"], both) == {"r": (1.0, 100)}


def test_idle_minutes_count_from_the_clock_s_start_and_every_ended_one_is_said() -> None:
    live = hold("rsv-0", "GPU-0")  # sorts before the one that ends
    ends = hold("rsv-a", "GPU-1")
    devices = [use("GPU-0"), use("GPU-1")]
    s, _ = run(JoinState(), [use("GPU-0", proc(1, "rsv-0", "reservation")), use("GPU-1")],
               [live], 0)  # fmt: skip
    s, _ = run(s, devices, [live, ends], 60_000)
    s, out = run(s, devices, [live, ends], 180_000)
    assert [t.reason for t in out if t.reservation_id == "rsv-0"] == [
        "no process, or utilization under 10%, on any of its GPUs for 2 min"
    ]
    _, out = run(s, devices, [live], 190_000)
    assert [(t.kind, t.reservation_id) for t in out] == [("reservation.inUse", "rsv-a")]


def test_a_unit_with_no_device_figure_is_as_busy_as_its_processes_together() -> None:
    def unit(*utils: int | None) -> DeviceUse:
        procs = tuple(proc(i, util=u) for i, u in enumerate(utils))
        return DeviceUse(device_id="MIG-1", sm_util=None, processes=procs)

    assert utilization(unit(70, 60, None)) == 100
    assert utilization(unit(20, None)) == 20
    assert utilization(unit(None)) is None
