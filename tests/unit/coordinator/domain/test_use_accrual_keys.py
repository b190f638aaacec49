"""Accrual of one pass, bucket by bucket (issue 31's mutation run): whose bucket a
unit's used time lands in, how stretches of one pass add up in it (used, weighted,
unknown, idle), the unbooked remainder, and passes merged before they are written."""

from __future__ import annotations

from coordinator.domain.gpu_use_accrual import (
    HOUR_MS,
    UNBOOKED,
    AccrualKey,
    AccrualWho,
    Accrued,
    accrue,
    merge,
)
from coordinator.domain.gpu_use_units import Hold
from shared.wire import DeviceUse, ProcessUse

H = HOUR_MS


def _hold(rid: str, start: int, end: int, unit: str = "GPU-0", cls: str = "gpu") -> Hold:
    return Hold(rid, "acme", "prj", "p1", "n1", cls, (unit,), start, end)


def _use(unit: str, util: int | None, owner: str = "r1", kind: str = "reservation") -> DeviceUse:
    return DeviceUse(
        device_id=unit,
        sm_util=util,
        processes=(ProcessUse(pid=1, owner=owner, owner_kind=kind),),  # type: ignore[arg-type]
    )


def test_a_sole_holder_is_credited_the_unit_s_use_whoever_runs_it() -> None:
    pod = DeviceUse(
        device_id="GPU-0",
        sm_util=50,
        processes=(ProcessUse(pid=1, owner="pod-1", owner_kind="pod", sm_util=3),),
    )
    out = accrue(
        {"n1": {"GPU-0": pod}}, [_hold("r1", 0, 2 * H)], {"n1": "p1"}, {"n1": (H, H + 1000)}
    )
    assert out == {
        AccrualKey(H, "r1", "n1", "GPU-0", "gpu", "acme"): Accrued(
            AccrualWho("p1", "prj"), used_ms=1000, weighted_ms=500
        )
    }


def test_the_stretches_of_one_pass_add_up_in_their_bucket() -> None:
    """r2 takes the other slot half way: r1's use before and after adds up, weighted
    (rounded down per stretch), unknown and idle alike; use at the threshold is work."""
    holds = [
        _hold(rid, start, 2 * H, unit, "gpu.slot")
        for unit in ("GPU-0", "GPU-1", "GPU-2")
        for rid, start in (("r1", 0), ("r2", 500))
    ]
    uses = {
        "n1": {"GPU-0": _use("GPU-0", 5), "GPU-1": _use("GPU-1", None), "GPU-2": _use("GPU-2", 10)}
    }
    out = accrue(uses, holds, {"n1": "p1"}, {"n1": (0, 999)}, idle_util_percent=10)
    low, unknown, at = (
        out[AccrualKey(0, "r1", "n1", u, "gpu.slot", "acme")] for u in ("GPU-0", "GPU-1", "GPU-2")
    )
    assert (low.used_ms, low.weighted_ms, low.unknown_ms, low.idle_ms) == (999, 49, 0, 999)
    assert (unknown.used_ms, unknown.weighted_ms, unknown.unknown_ms) == (999, 0, 999)
    assert (at.used_ms, at.weighted_ms, at.idle_ms) == (999, 99, 0)
    assert all(k.reservation_id != "r2" for k in out)  # no process of its own


def test_one_used_millisecond_counts_and_the_unbooked_rest_is_the_union_s_complement() -> None:
    out = accrue(
        {"n1": {"GPU-0": _use("GPU-0", 50)}}, [_hold("r1", 0, H)], {"n1": "p1"}, {"n1": (0, 1)}
    )
    assert out[AccrualKey(0, "r1", "n1", "GPU-0", "gpu", "acme")].used_ms == 1
    holds = [_hold("r1", 0, 600), _hold("r2", 100, 200), _hold("r3", 500, 900)]
    out = accrue(
        {"n1": {"GPU-0": _use("GPU-0", 50, "", "unknown")}}, holds, {"n1": "p1"}, {"n1": (0, 1000)}
    )
    free = out[AccrualKey(0, UNBOOKED, "n1", "GPU-0", "gpu", "")]
    assert (free.who, free.used_ms) == (AccrualWho("p1", None), 100)


def test_passes_merged_keep_and_add_their_idle_time() -> None:
    who = AccrualWho("p1", None)
    key = AccrualKey(0, "r1", "n1", "GPU-0", "gpu", "acme")
    into: dict[AccrualKey, Accrued] = {}
    merge(into, {key: Accrued(who, 100, 10, 0, 40)})
    merge(into, {key: Accrued(who, 100, 10, 0, 30)})
    assert into[key] == Accrued(who, 200, 20, 0, 70)


def test_a_unit_without_a_process_accrues_nothing_and_the_next_one_still_does() -> None:
    idle = DeviceUse(device_id="GPU-0", sm_util=0)
    uses = {"n1": {"GPU-0": idle, "GPU-1": _use("GPU-1", 50)}}
    holds = [_hold("r1", 0, H), _hold("r1", 0, H, unit="GPU-1")]
    out = accrue(uses, holds, {"n1": "p1"}, {"n1": (0, 1000)})
    assert list(out) == [AccrualKey(0, "r1", "n1", "GPU-1", "gpu", "acme")]


def test_tenants_taking_an_unbooked_gpu_in_turn_each_have_their_own_time() -> None:
    """Within one hour acme's process, then beta's, on a GPU nobody booked: a bucket
    each (the tenant is part of the key), kept apart when passes are merged before a
    write; their processes at once are nobody's (never counted for two)."""
    tenant_of = {"ra": "acme", "rb": "beta"}
    into: dict[AccrualKey, Accrued] = {}
    for owner, window in (("ra", (0, 1000)), ("rb", (1000, 3000)), ("ra", (3000, 3500))):
        uses = {"n1": {"GPU-0": _use("GPU-0", 50, owner)}}
        merge(into, accrue(uses, [], {"n1": "p1"}, {"n1": window}, tenant_of=tenant_of))
    assert {k.tenant_id: v.used_ms for k, v in into.items()} == {"acme": 1500, "beta": 2000}
    both = DeviceUse(
        device_id="GPU-0",
        sm_util=50,
        processes=tuple(
            ProcessUse(pid=i, owner=o, owner_kind="reservation") for i, o in enumerate(tenant_of)
        ),
    )
    out = accrue({"n1": {"GPU-0": both}}, [], {"n1": "p1"}, {"n1": (0, 10)}, tenant_of=tenant_of)
    assert [(k.tenant_id, v.used_ms) for k, v in out.items()] == [("", 10)]
