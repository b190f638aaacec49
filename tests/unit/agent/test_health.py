"""Health classification and hysteresis, driven by a fake clock (plain numbers)."""

from __future__ import annotations

from agent.health import HealthPolicy, HealthState, evaluate, fabric_findings, findings
from agent.readings import GpuCounters, XidEvent
from agent.xid import XidTable

A, B = "GPU-a", "GPU-b"
POLICY = HealthPolicy(recover_after_s=30, xid_hold_s=60)


def ok(uuid: str = A, **kw: object) -> GpuCounters:
    return GpuCounters(index=0 if uuid == A else 1, uuid=uuid, **kw)  # type: ignore[arg-type]


def step(
    prev: HealthState,
    now: float,
    a: GpuCounters | None = None,
    xids: tuple[XidEvent, ...] = (),
    policy: HealthPolicy = POLICY,
) -> HealthState:
    return evaluate(prev, [a or ok(A), ok(B)], xids, now, policy)


def test_all_clear_is_healthy() -> None:
    s = step(HealthState(), 0)
    assert s.node.status == "healthy" and s.unhealthy_devices() == ()


def test_application_xids_are_not_faults() -> None:
    for xid in (13, 31, 43, 45, 68):
        s = step(HealthState(), 0, xids=(XidEvent(A, xid, 0),))
        assert s.devices[A].status == "healthy", xid


def test_fault_xids_make_the_device_unhealthy() -> None:
    for xid in (46, 48, 62, 64, 74, 79, 95, 109, 119, 120, 140, 143, *range(144, 151), 155):
        s = step(HealthState(), 0, xids=(XidEvent(A, xid, 0),))
        assert s.devices[A].status == "unhealthy", xid
        assert f"xid {xid}" in s.devices[A].reasons[0]
        assert s.devices[B].status == "healthy"
        assert s.node.status == "degraded"  # one bad GPU does not take the node down


def test_xid_table_is_configurable_both_ways() -> None:
    policy = HealthPolicy(xids=XidTable.configured(add=(13,), ignore=(79,)))
    s = step(HealthState(), 0, xids=(XidEvent(A, 79, 0), XidEvent(B, 13, 0)), policy=policy)
    assert s.devices[A].status == "healthy"
    s = evaluate(HealthState(), [ok(B)], (XidEvent(B, 13, 0),), 0, policy)
    assert s.devices[B].status == "unhealthy"


def test_added_fault_xid_holds_then_recovers_after_hysteresis() -> None:
    policy = HealthPolicy(xids=XidTable.configured(add=(200,)), recover_after_s=30, xid_hold_s=60)
    s = step(HealthState(), 0, xids=(XidEvent(A, 200, 0),), policy=policy)
    s = step(s, 59, policy=policy)
    assert s.devices[A].status == "unhealthy"  # still within xid_hold_s
    s = step(s, 61, policy=policy)  # the condition has cleared; recovery must wait 30 s
    assert s.devices[A].status == "unhealthy"
    s = step(s, 90, policy=policy)
    assert s.devices[A].status == "unhealthy"
    s = step(s, 91, policy=policy)
    assert s.devices[A].status == "healthy" and s.node.status == "healthy"


def test_flapping_condition_does_not_flip_back() -> None:
    dbe = ok(A, dbe_volatile=1)
    s = step(HealthState(), 0, dbe)
    for t in range(1, 100, 10):
        s = step(s, t, dbe if t % 20 == 1 else ok(A))
        assert s.devices[A].status == "unhealthy", t
    s = step(s, 100)
    s = step(s, 131)
    assert s.devices[A].status == "healthy"


def test_thermal_and_power_only_degrade() -> None:
    s = step(HealthState(), 0, ok(A, thermal_slowdown=True, power_slowdown=True))
    assert s.devices[A].status == "degraded"
    assert s.devices[A].reasons == ("thermal slowdown", "power brake slowdown")
    assert s.node.status == "degraded"


def test_worse_condition_escalates_at_once() -> None:
    s = step(HealthState(), 0, ok(A, thermal_slowdown=True))
    s = step(s, 1, ok(A, remap_failure=True))
    assert s.devices[A].status == "unhealthy"


def test_each_counter_condition() -> None:
    cases = {
        "GPU is lost": ok(A, lost=True),
        "double-bit": ok(A, dbe_volatile=2),
        "page retirement pending": ok(A, retired_pending=True),
        "retired pages: 60": ok(A, retired_pages=60),
        "row remapping failure": ok(A, remap_failure=True),
        "row remapping pending": ok(A, remap_pending=True),
        "NVLink down: link 2,5": ok(A, nvlink_down=(2, 5)),
    }
    for text, counters in cases.items():
        found = findings(counters, POLICY)
        assert found and found[0][0] == "unhealthy" and text in found[0][1], text
    assert findings(ok(A, retired_pages=3), POLICY) == []


def test_every_gpu_unhealthy_makes_the_node_unhealthy() -> None:
    s = evaluate(HealthState(), [ok(A, lost=True), ok(B, lost=True)], (), 0, POLICY)
    assert s.node.status == "unhealthy"
    assert len(s.unhealthy_devices()) == 2


def test_nvml_failure_is_unmonitored_and_keeps_device_states() -> None:
    s = step(HealthState(), 0, ok(A, dbe_volatile=1))
    s = evaluate(s, [], (), 5, POLICY, nvml_error="nvml init failed")
    assert s.node.status == "unmonitored"
    assert s.node.reasons == ("nvml init failed",)
    assert s.devices[A].status == "unhealthy"


def test_reasons_are_capped_for_small_heartbeats() -> None:
    bad = ok(
        A,
        dbe_volatile=1,
        retired_pending=True,
        remap_failure=True,
        remap_pending=True,
        nvlink_down=tuple(range(18)),
        thermal_slowdown=True,
    )
    s = step(HealthState(), 0, bad, xids=(XidEvent(A, 79, 0),))
    (device,) = s.unhealthy_devices()
    assert len(device.reasons) == 4
    assert all(len(r) <= 120 for r in device.reasons)


def test_catalogue_classes_for_newer_xids() -> None:
    table = XidTable()
    for xid in (121, 123, 63, 92):
        assert table.classify(xid) == "informational", xid
    for xid in (143, *range(144, 151), 155):
        assert table.classify(xid) == "reset", xid
    assert table.classify(154) == "recovery"
    assert table.classify(94) == "reset_degraded"
    s = step(HealthState(), 0, xids=(XidEvent(A, 121, 0), XidEvent(B, 94, 0)))
    assert s.devices[A].status == "healthy"
    assert s.devices[B].status == "degraded"  # contained: reset when convenient


def test_reset_xid_is_held_past_every_timer_until_a_reset_is_seen() -> None:
    s = step(HealthState(), 0, xids=(XidEvent(A, 74, 0),))
    for t in range(5, 1000, 50):
        s = step(s, t)
        assert s.devices[A].status == "unhealthy", t
    s = step(s, 1000, ok(A, recovery_action=0))  # NVML says no action is needed
    s = step(s, 1031, ok(A, recovery_action=0))
    assert s.devices[A].status == "healthy"


def test_reset_seen_as_the_gpu_going_away_and_back_without_the_field() -> None:
    s = step(HealthState(), 0, xids=(XidEvent(A, 79, 0),))
    s = step(s, 10, ok(A, unreadable="handle: NVMLError_Unknown"))
    assert s.devices[A].status == "unhealthy"
    s = step(s, 20)
    s = step(s, 51)
    assert s.devices[A].status == "healthy"


def test_driver_unload_counts_as_going_away() -> None:
    s = step(HealthState(), 0, xids=(XidEvent(A, 48, 0),))
    s = evaluate(s, [], (), 5, POLICY, nvml_error="nvml init failed")
    s = step(s, 10)
    s = step(s, 41)
    assert s.devices[A].status == "healthy"


def test_nic_findings_through_extra_with_hysteresis() -> None:
    nic = "0000:1a:00.0"
    down = {nic: (("unhealthy", "mlx5_0/1: InfiniBand port 1: DOWN"),)}
    s = evaluate(HealthState(), [ok(A)], (), 0, POLICY, extra=down)
    assert s.devices[nic].status == "unhealthy" and s.node.status == "degraded"
    s = evaluate(s, [ok(A)], (), 10, POLICY, extra={nic: ()})
    assert s.devices[nic].status == "unhealthy"
    s = evaluate(s, [ok(A)], (), 41, POLICY, extra={nic: ()})
    assert s.devices[nic].status == "healthy"


def test_xid_of_an_unknown_gpu_is_kept_at_node_level_for_the_hold() -> None:
    s = step(HealthState(), 0, xids=(XidEvent("unknown", 79, 0),))
    assert s.node.status == "degraded"
    assert any("xid 79" in r and "unidentified GPU" in r for r in s.node.reasons)
    assert step(s, 59).node.status == "degraded"
    assert step(s, 61).node.status == "healthy"
    # Application XIDs of an unknown GPU still do not count.
    assert step(HealthState(), 0, xids=(XidEvent("unknown", 13, 0),)).node.status == "healthy"


def test_nvml_down_still_steps_other_devices() -> None:
    nic = "0000:1a:00.0"
    down = {nic: (("unhealthy", "port down"),)}
    s = evaluate(HealthState(), [], (), 0, POLICY, nvml_error="nvml init failed", extra=down)
    assert s.node.status == "unmonitored"
    assert [d.device_id for d in s.unhealthy_devices()] == [nic]


def test_fabric_health_mask_classification() -> None:
    healthy = 2 | 2 << 2 | 2 << 4 | 2 << 6 | 1 << 8 | 1 << 14  # every flag false, GFM up
    assert fabric_findings(healthy, 1) == []
    assert fabric_findings(0, None) == []  # nothing supported: nothing known
    recovering = healthy & ~(3 << 2) | 1 << 2  # route recovery: true
    assert fabric_findings(recovering, 1) == [("degraded", "fabric: route recovery in progress")]
    assert fabric_findings(5 << 8, None) == [
        ("unhealthy", "fabric: incorrect configuration (insufficient NVLinks)")
    ]
    assert fabric_findings(2 << 14, None) == [
        ("degraded", "fabric: global fabric manager disconnected")
    ]
    assert fabric_findings(1 << 6, 3) == [
        ("degraded", "fabric: health summary limited capacity"),
        ("degraded", "fabric: access timeout recovery in progress"),
    ]
