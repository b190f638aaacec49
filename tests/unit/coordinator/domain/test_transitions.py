"""The pure transition function: what changed between a node's flags before and after."""

from __future__ import annotations

from dataclasses import replace

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from coordinator.domain.transitions import (
    Cause,
    DeviceFlags,
    NodeFlags,
    after_heartbeat,
    after_inventory,
    node_transitions,
)
from shared.wire import ALERT_KINDS, DeviceHealth, GpuInfo
from tests.factories import make_heartbeat, make_inventory

POOL_A, POOL_B = "pool_" + "a" * 26, "pool_" + "b" * 26
HEALTH = st.sampled_from(["healthy", "degraded", "unhealthy", "unmonitored"])
DEVICE = st.builds(DeviceFlags, HEALTH, st.lists(st.text(max_size=5), max_size=2).map(tuple))
DEVICE_IDS = st.sampled_from(["GPU-0", "GPU-1", "nic0"])


@st.composite
def flags(draw: st.DrawFn) -> NodeFlags:
    return NodeFlags(
        pool_id=draw(st.sampled_from([POOL_A, POOL_B])),
        reachable=draw(st.booleans()),
        health=draw(HEALTH),
        health_reasons=tuple(draw(st.lists(st.text(max_size=5), max_size=2))),
        provisioning=draw(st.booleans()),
        maintenance=draw(st.booleans()),
        devices=draw(st.dictionaries(DEVICE_IDS, DEVICE, max_size=3)),
    )


@given(flags())
def test_no_change_is_no_transition(node: NodeFlags) -> None:
    assert node_transitions(node, node) == ()
    assert node_transitions(node, replace(node, health_reasons=("other words",))) == ()


@given(flags(), flags())
def test_one_transition_per_changed_flag_named_after_the_new_state(
    before: NodeFlags, after: NodeFlags
) -> None:
    kinds = [t.kind for t in node_transitions(before, after)]
    assert set(kinds) <= set(ALERT_KINDS)
    expected: list[str] = []
    if before.pool_id != after.pool_id:
        expected.append("node.poolChanged")
    if before.reachable != after.reachable:
        expected.append("node.reachable" if after.reachable else "node.unreachable")
    if before.maintenance != after.maintenance:
        expected.append("node.maintenance" if after.maintenance else "node.maintenanceEnded")
    if before.provisioning != after.provisioning:
        expected.append("node.provisioning" if after.provisioning else "node.provisioned")
    if before.health != after.health:
        expected.append(f"node.{after.health}")
    for device_id in sorted(after.devices):
        old, new = before.device(device_id).status, after.devices[device_id].status
        if old != new:
            faulty = new in ("unhealthy", "unmonitored")
            expected.append("device.unhealthy" if faulty else f"device.{new}")
    assert kinds == expected


@given(flags())
def test_a_new_node_registers_then_says_how_it_differs_from_a_fresh_one(after: NodeFlags) -> None:
    transitions = node_transitions(None, after, hostname="gpu01")
    assert transitions[0].kind == "node.registered"
    assert transitions[0].reason == "first inventory from gpu01"
    fresh = NodeFlags(after.pool_id)
    assert transitions[1:] == node_transitions(fresh, after)


def test_device_health_kinds_and_reasons() -> None:
    before = NodeFlags("p", devices={"GPU-0": DeviceFlags(), "GPU-1": DeviceFlags()})
    after = replace(
        before,
        devices={
            "GPU-0": DeviceFlags("degraded", ("thermal slowdown",)),
            "GPU-1": DeviceFlags("unmonitored", ("nvml gone",)),
        },
    )
    got = [(t.kind, t.device_id, t.reason) for t in node_transitions(before, after)]
    assert got == [
        ("device.degraded", "GPU-0", "thermal slowdown"),
        ("device.unhealthy", "GPU-1", "nvml gone"),
    ]
    # A device that left the node (retired) is no transition; a new one is compared
    # with healthy.
    assert node_transitions(before, replace(before, devices={})) == ()
    sick = replace(before, devices={"GPU-9": DeviceFlags("unhealthy", ("xid 79",))})
    assert [t.kind for t in node_transitions(before, sick)] == ["device.unhealthy"]


def test_maintenance_carries_the_operators_reason_and_name_both_ways() -> None:
    idle = NodeFlags("p")
    busy = replace(idle, maintenance=True, maintenance_reason="swap PSU", maintenance_by="ops")
    (on,) = node_transitions(idle, busy, Cause("ops", "swap PSU"))
    (off,) = node_transitions(busy, idle, Cause("ops/bob", "PSU swapped"))
    assert (on.kind, on.reason, on.by, on.details) == (
        "node.maintenance",
        "swap PSU",
        "ops",
        {"maintenance": True},
    )
    assert (off.kind, off.reason, off.by) == ("node.maintenanceEnded", "PSU swapped", "ops/bob")
    # Transitions nobody caused by hand are the coordinator's.
    (lost,) = node_transitions(idle, replace(idle, reachable=False))
    assert (lost.by, lost.reason) == ("coordinator", "no heartbeat within misses x interval")


def test_a_heartbeat_lists_only_sick_devices_the_rest_are_healthy() -> None:
    inv = make_inventory("n1", POOL_A, gpus=2)
    before = NodeFlags(
        POOL_A,
        health="unhealthy",
        devices={"GPU-n1-0": DeviceFlags("unhealthy", ("xid 79",)), "GPU-n1-1": DeviceFlags()},
    )
    sick = (
        DeviceHealth(device_id="GPU-n1-1", status="degraded", reasons=("hot",)),
        DeviceHealth(device_id="GPU-unknown", status="unhealthy"),
    )
    after = after_heartbeat(before, make_heartbeat(inv, health="degraded", devices=sick))
    assert after.health == "degraded"
    assert dict(after.devices) == {
        "GPU-n1-0": DeviceFlags(),
        "GPU-n1-1": DeviceFlags("degraded", ("hot",)),
    }
    kinds = [t.kind for t in node_transitions(before, after)]
    assert kinds == ["node.degraded", "device.healthy", "device.degraded"]


def test_an_inventory_sets_health_and_devices_but_not_reachability_or_maintenance() -> None:
    before = NodeFlags(POOL_A, reachable=False, maintenance=True, maintenance_reason="m")
    inv = make_inventory(
        "n1",
        POOL_B,
        gpus=1,
        provisioning=True,
        devices=(DeviceHealth(device_id="GPU-n1-0", status="unhealthy"),),
    )
    after = after_inventory(before, inv)
    assert (after.reachable, after.maintenance, after.maintenance_reason) == (False, True, "m")
    assert (after.pool_id, after.provisioning) == (POOL_B, True)
    assert dict(after.devices) == {"GPU-n1-0": DeviceFlags("unhealthy")}
    kinds = [t.kind for t in node_transitions(before, after)]
    assert kinds == ["node.poolChanged", "node.provisioning", "device.unhealthy"]


def test_a_device_that_goes_missing_is_device_missing_and_its_return_is_said() -> None:
    lost = DeviceFlags("unhealthy", ("missing: NVML_ERROR_UNKNOWN",))
    ok = NodeFlags("p", devices={"GPU-0": DeviceFlags(), "GPU-1": DeviceFlags()})
    gone = replace(ok, devices={**ok.devices, "GPU-1": lost})
    (t,) = node_transitions(ok, gone)
    assert (t.kind, t.device_id, t.reason) == ("device.missing", "GPU-1", lost.reasons[0])
    # Still missing: nothing new; back (after the agent's hysteresis): healthy.
    assert node_transitions(gone, gone) == ()
    assert [(t.kind, t.device_id) for t in node_transitions(gone, ok)] == [
        ("device.healthy", "GPU-1")
    ]
    # Unhealthy before (an XID), then missing: the health is the same, missing is news;
    # found again but still held for the XID: said, though its health did not change.
    xid = DeviceFlags("unhealthy", ("XID 79: held until a GPU reset",))
    sick = replace(ok, devices={**ok.devices, "GPU-1": xid})
    assert [t.kind for t in node_transitions(sick, gone)] == ["device.missing"]
    assert [(t.kind, t.reason) for t in node_transitions(gone, sick)] == [
        ("device.unhealthy", xid.reasons[0])
    ]


def test_a_missing_stand_in_replaced_by_the_gpu_read_again_is_device_healthy() -> None:
    standin = "missing-pci-0000:1b:00.0"
    before = NodeFlags("p", devices={standin: DeviceFlags("unhealthy", ("missing: GPU is lost",))})
    after = replace(before, devices={"GPU-real": DeviceFlags()})
    (t,) = node_transitions(before, after)
    assert (t.kind, t.device_id) == ("device.healthy", standin)
    assert t.reason.startswith("no longer missing")


def test_an_inventory_gpu_marked_missing_is_missing_whatever_its_health_says() -> None:
    inv = make_inventory("n1", POOL_A, gpus=2)
    gpus = (
        GpuInfo(uuid="GPU-n1-0", index=0, name="H100", memory_mib=1, pci_bus_id="a"),
        GpuInfo(
            uuid="GPU-n1-1", index=1, name="unknown", memory_mib=0, pci_bus_id="b", missing="gone"
        ),
    )
    after = after_inventory(None, msgspec.structs.replace(inv, gpus=gpus))
    assert after.devices["GPU-n1-1"] == DeviceFlags("unhealthy", ("missing: gone",))
    kinds = [(t.kind, t.device_id) for t in node_transitions(None, after)]
    assert kinds == [("node.registered", None), ("device.missing", "GPU-n1-1")]
    # The agent's own missing reason is kept as it is, not said twice.
    said = (DeviceHealth(device_id="GPU-n1-1", status="unhealthy", reasons=("missing: x",)),)
    again = after_inventory(None, msgspec.structs.replace(inv, gpus=gpus, devices=said))
    assert again.devices["GPU-n1-1"] == DeviceFlags("unhealthy", ("missing: x",))
