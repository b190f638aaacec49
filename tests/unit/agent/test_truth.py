"""The agent never hides a device (SPEC §4): every failure produced by the simulated NVML
or the fake sysfs tree, through the real reader, presence, health and inventory."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pynvml
import pytest

from agent.health import HealthPolicy
from agent.inventory import Identity
from agent.poller import Poller
from agent.reader import NvmlReader
from agent.sim.faults import FaultFile, write_faults
from agent.sim.nvml import SimulatedNvml
from agent.sim.profile import load_profile
from agent.sim.sysfs_tree import FaultedPorts, build_tree
from agent.state import AgentState
from agent.sysfs import read_host
from agent.xid_watch import XidWatcher
from shared.clock import FakeClock
from shared.ids import new_pool_id


class NoRecoveryField(SimulatedNvml):
    """A driver older than the GPU recovery action field."""

    def nvmlDeviceGetFieldValues(self, handle: Any, fieldIds: list[int]) -> Any:
        values = super().nvmlDeviceGetFieldValues(handle, fieldIds)
        for v in values:
            if v.fieldId == pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION:
                v.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return values


class Rig:
    def __init__(
        self,
        tmp_path: Path,
        profile: str = "h100-sxm-8",
        faults: list[dict[str, Any]] | None = None,
        nvml_class: type[SimulatedNvml] = SimulatedNvml,
        watch: bool = False,
        **kw: Any,
    ) -> None:
        self.path = tmp_path / "faults.json"
        if faults is not None:
            write_faults(self.path, faults)
        prof = load_profile(profile)
        self.root = build_tree(tmp_path / "root", prof)
        self.clock = FakeClock()
        self.nvml = nvml_class(prof, "n1", FaultFile(self.path))
        self.watcher = XidWatcher(self.nvml, self.clock, wait_ms=20) if watch else None
        self.poller = Poller(
            reader=NvmlReader(self.nvml, cpu_count=prof.vcpu),
            read_host=lambda: read_host(self.root),
            ident=Identity(node_id="n1", pool_id=new_pool_id(), profile_id=prof.id),
            clock=self.clock,
            boot_id="boot",
            policy=HealthPolicy(recover_after_s=10, xid_hold_s=5),
            watcher=self.watcher,
            read_ports=FaultedPorts(self.root, FaultFile(self.path)),
            host_every_s=0,
            **kw,
        )

    def faults(self, faults: list[dict[str, Any]]) -> None:
        write_faults(self.path, faults)

    def poll(self, dt: float = 5.0) -> AgentState:
        self.clock.advance(round(dt * 1000))
        return self.poller.poll_once()

    def poll_until_xid(self, dt: float = 5.0) -> AgentState:
        """Poll until the XID thread has queued the event (it runs on its own thread)."""
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            state = self.poll(dt)
            if any("xid" in r for d in state.devices for r in d.reasons):
                return state
            time.sleep(0.02)
        raise AssertionError("no xid heard")

    def poll_until_node_reason(self, text: str, dt: float = 5.0) -> AgentState:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            state = self.poll(dt)
            if any(text in r for r in state.health.reasons):
                return state
            time.sleep(0.02)
        raise AssertionError(f"{text!r} never in the node's reasons")

    def close(self) -> None:
        if self.watcher is not None:
            self.watcher.stop()


def statuses(state: AgentState) -> dict[str, str]:
    return {d.device_id: d.status for d in state.devices}


# -- GPUs NVML cannot read ------------------------------------------------------------------


@pytest.mark.parametrize(
    "fault",
    [
        {"kind": "lost", "gpu": 2},
        {"kind": "handle_error", "gpu": 2, "error": "unknown"},
        {"kind": "handle_error", "gpu": 2, "error": "no_permission"},
        {"kind": "handle_error", "gpu": 2, "error": "function_not_found"},
        {"kind": "absent", "gpu": 2},
    ],
)
def test_gpu_unreadable_from_the_start_is_a_missing_device(
    tmp_path: Path, fault: dict[str, Any]
) -> None:
    state = Rig(tmp_path, faults=[fault]).poll()
    inv = state.inventory
    assert len(inv.gpus) == 8  # never dropped
    missing = next(g for g in inv.gpus if g.missing)
    # The PCI bus names it: the id is its PCI address, stable across reboots.
    assert missing.uuid == "missing-pci-0000:3a:00.0" and missing.pci_bus_id == "0000:3a:00.0"
    assert f"n1:gpu:{missing.uuid}" in {a.atom_id for a in inv.atoms}
    assert statuses(state) == {missing.uuid: "unhealthy"}
    # Every way of never being read says `missing:` (the coordinator's device.missing).
    assert state.devices[0].reasons[0].startswith("missing: ")
    assert state.health.status == "degraded"


def test_gpu_seen_then_unreadable_keeps_its_id_and_stays_unhealthy(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    first = rig.poll()
    uuid = first.inventory.gpus[4].uuid
    rig.faults([{"kind": "dbe", "gpu": 4}])
    assert statuses(rig.poll()) == {uuid: "unhealthy"}
    # Unhealthy, then unreadable: it must not pass through healthy (no skipped hysteresis).
    rig.faults([{"kind": "handle_error", "gpu": 4, "error": "unknown"}])
    for _ in range(5):
        state = rig.poll()
        assert statuses(state) == {uuid: "unhealthy"}
        assert "missing: handle" in state.devices[0].reasons[0]
    assert state.inventory.inventory_hash == first.inventory.inventory_hash  # atoms stay


def test_gpu_that_disappears_from_enumeration_stays(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    first = rig.poll()
    uuid = first.inventory.gpus[6].uuid
    rig.faults([{"kind": "absent", "gpu": 6}])
    state = rig.poll()
    assert {g.uuid for g in state.inventory.gpus} == {g.uuid for g in first.inventory.gpus}
    assert statuses(state) == {uuid: "unhealthy"}


def test_expected_inventory_shortfall_is_unhealthy_capacity(tmp_path: Path) -> None:
    rig = Rig(tmp_path, expected={"gpu": 9, "disk": 10})
    state = rig.poll()
    inv = state.inventory
    assert len(inv.gpus) == 9 and inv.gpus[-1].uuid == "missing-expected-8"
    disks = [a for a in inv.atoms if a.cls == "disk"]
    assert len(disks) == 10
    assert statuses(state) == {
        "missing-expected-8": "unhealthy",
        "missing:disk:8": "unhealthy",
        "missing:disk:9": "unhealthy",
    }
    assert state.health.status == "degraded"


# -- XIDs --------------------------------------------------------------------------------


def test_xids_of_a_gpu_after_an_unreadable_one_are_heard(tmp_path: Path) -> None:
    rig = Rig(tmp_path, faults=[{"kind": "handle_error", "gpu": 3, "error": "unknown"}], watch=True)
    try:
        first = rig.poll()
        assert rig.watcher is not None and rig.watcher.registered == {0, 1, 2, 4, 5, 6, 7}
        gpu7 = first.inventory.gpus[7].uuid
        rig.faults(
            [
                {"kind": "handle_error", "gpu": 3, "error": "unknown"},
                {"kind": "xid", "gpu": 7, "xid": 48},
            ]
        )
        state = rig.poll_until_xid()
        assert statuses(state)[gpu7] == "unhealthy"
    finally:
        rig.close()


def test_event_set_is_recreated_after_nvml_reinitialises(tmp_path: Path) -> None:
    rig = Rig(tmp_path, profile="l40s-pcie-4", watch=True)
    try:
        first = rig.poll()
        rig.faults([{"kind": "nvml_down"}])
        assert rig.poll().health.status == "unmonitored"
        rig.faults([])
        rig.poll()
        rig.faults([{"kind": "xid", "gpu": 1, "xid": 79}])
        state = rig.poll_until_xid()
        assert statuses(state) == {first.inventory.gpus[1].uuid: "unhealthy"}
    finally:
        rig.close()


def test_reset_xid_holds_until_the_recovery_action_clears(tmp_path: Path) -> None:
    rig = Rig(tmp_path, profile="l40s-pcie-4", watch=True)
    try:
        gpu = rig.poll().inventory.gpus[0].uuid
        rig.faults([{"kind": "xid", "gpu": 0, "xid": 79}])
        rig.poll_until_xid()
        rig.faults([])
        for _ in range(20):  # 100 s: far past xid_hold_s and recover_after_s
            state = rig.poll()
            assert statuses(state) == {gpu: "unhealthy"}
        assert any("reboot required" in r for r in state.devices[0].reasons)
        rig.faults([{"kind": "reset", "gpu": 0}])
        rig.poll()
        state = rig.poll(11)  # the reset seen; recovery still goes through hysteresis
        assert state.devices == ()
    finally:
        rig.close()


def test_reset_xid_without_recovery_field_holds_until_the_gpu_comes_back(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path, profile="l40s-pcie-4", nvml_class=NoRecoveryField, watch=True)
    try:
        gpu = rig.poll().inventory.gpus[2].uuid
        rig.faults([{"kind": "xid", "gpu": 2, "xid": 119}])
        rig.poll_until_xid()
        rig.faults([])
        for _ in range(20):
            assert statuses(rig.poll()) == {gpu: "unhealthy"}
        rig.faults([{"kind": "lost", "gpu": 2}])  # the reset: gone ...
        assert statuses(rig.poll()) == {gpu: "unhealthy"}
        rig.faults([])  # ... and back
        rig.poll()
        assert rig.poll(11).devices == ()
    finally:
        rig.close()


# -- new health signals -----------------------------------------------------------------------


def test_fabric_manager_not_started_makes_every_gpu_unhealthy(tmp_path: Path) -> None:
    rig = Rig(tmp_path, faults=[{"kind": "fabric", "state": 1}])
    state = rig.poll()
    assert len(state.devices) == 8 and {d.status for d in state.devices} == {"unhealthy"}
    assert "fabric manager: state not started" in state.devices[0].reasons[0]
    assert state.health.status == "unhealthy"
    rig.faults([{"kind": "fabric", "state": 3, "status": pynvml.NVML_ERROR_UNKNOWN}])
    assert "fabric manager: status" in rig.poll().devices[0].reasons[0]
    rig.faults([])
    rig.poll()
    assert rig.poll(11).health.status == "healthy"


def test_pcie_downtraining_and_replay_bursts_degrade(tmp_path: Path) -> None:
    rig = Rig(tmp_path, profile="l40s-pcie-4")
    gpus = [g.uuid for g in rig.poll().inventory.gpus]
    rig.faults(
        [
            {"kind": "pcie", "gpu": 0, "width": 8},
            {"kind": "pcie", "gpu": 1, "gen": 3},
            {"kind": "pcie_replay", "gpu": 2, "count": 50},
            {"kind": "pcie_replay", "gpu": 3, "count": 5},  # within DCGM's 8 a minute
        ]
    )
    state = rig.poll()
    assert statuses(state) == {gpus[0]: "degraded", gpus[1]: "degraded", gpus[2]: "degraded"}
    reasons = {d.device_id: d.reasons[0] for d in state.devices}
    assert reasons[gpus[0]] == "PCIe link width x8 of x16"
    assert reasons[gpus[1]] == "PCIe link Gen3 of Gen4"
    assert reasons[gpus[2]].startswith("PCIe replays: 50")
    assert state.health.status == "degraded"


def test_nvlink_error_bursts_degrade(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    gpus = [g.uuid for g in rig.poll().inventory.gpus]
    rig.faults(
        [
            {"kind": "nvlink_crc", "gpu": 0, "count": 100_000},
            {"kind": "nvlink_replay", "gpu": 1, "count": 3},
            {"kind": "nvlink_recovery", "gpu": 2, "count": 2},
            {"kind": "nvlink_crc", "gpu": 3, "count": 10},  # a trickle of CRC errors is normal
        ]
    )
    state = rig.poll()
    assert statuses(state) == {gpus[0]: "degraded", gpus[1]: "degraded", gpus[2]: "degraded"}
    # No new errors: the burst is over, and recovery waits for hysteresis.
    assert len(rig.poll(61).devices) == 3
    assert rig.poll(11).devices == ()


def test_pending_mig_mode_change_degrades(tmp_path: Path) -> None:
    rig = Rig(tmp_path, profile="a100-mig-8", faults=[{"kind": "mig_pending", "gpu": 5}])
    (device,) = rig.poll().devices
    assert device.status == "degraded" and "MIG mode change pending" in device.reasons[0]


def test_infiniband_port_down_makes_that_nics_atoms_unhealthy(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    assert rig.poll().devices == ()
    rig.faults([{"kind": "port_down", "nic": "ibp3s0"}])
    state = rig.poll()
    assert statuses(state) == {"0000:5e:00.0": "unhealthy"}
    assert any("InfiniBand port 1: DOWN" in r for r in state.devices[0].reasons)
    moved = [a for a in state.inventory.atoms if a.device_id == "0000:5e:00.0"]
    assert len(moved) == 4  # its four VFs
    rig.faults([])
    rig.poll()
    assert rig.poll(11).devices == ()


# -- releasing NVML ---------------------------------------------------------------------------


def test_release_lets_go_of_nvml_and_resumes(tmp_path: Path) -> None:
    release = tmp_path / "release-nvml"
    rig = Rig(tmp_path, profile="l40s-pcie-4", watch=True, release_file=release)
    try:
        first = rig.poll()
        assert rig.watcher is not None and rig.watcher.running
        release.touch()
        state = rig.poll()
        assert state.health.status == "unmonitored"
        assert "NVML released" in state.health.reasons[0]
        assert not rig.watcher.running and rig.nvml._initialised == 0  # /dev/nvidia* closed
        assert state.inventory.gpus == first.inventory.gpus  # atoms stay while released
        release.unlink()
        state = rig.poll()
        assert state.health.status == "healthy" and rig.watcher.running
        rig.poller.request_release()
        assert rig.poll().health.status == "unmonitored" and rig.nvml._initialised == 0
        rig.poller.request_resume()
        assert rig.poll().health.status == "healthy"
    finally:
        rig.close()


# -- findings outside NVML while NVML is down -----------------------------------------------


def test_nic_port_down_while_nvml_is_down_is_reported(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    assert rig.poll().devices == ()
    rig.faults([{"kind": "nvml_down"}, {"kind": "port_down", "nic": "ibp3s0"}])
    state = rig.poll()
    assert state.health.status == "unmonitored"
    assert statuses(state) == {"0000:5e:00.0": "unhealthy"}
    rig.faults([{"kind": "nvml_down"}])
    rig.poll()
    assert rig.poll(11).devices == ()  # its recovery goes through hysteresis too


def test_placeholders_stay_while_nvml_is_down_from_the_start(tmp_path: Path) -> None:
    rig = Rig(tmp_path, faults=[{"kind": "nvml_down"}], expected={"disk": 10})
    state = rig.poll()
    assert state.health.status == "unmonitored"
    assert statuses(state) == {"missing:disk:8": "unhealthy", "missing:disk:9": "unhealthy"}


# -- an XID whose GPU cannot be named ---------------------------------------------------------


class UuidFailsAfterRegistering(SimulatedNvml):
    """The driver answers UUIDs until an XID arrives, then fails them (a GPU in trouble)."""

    broken = False

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        if self.broken:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
        return super().nvmlDeviceGetUUID(handle)


def test_xid_whose_uuid_fails_is_filed_under_its_gpu(tmp_path: Path) -> None:
    rig = Rig(tmp_path, profile="l40s-pcie-4", nvml_class=UuidFailsAfterRegistering, watch=True)
    try:
        first = rig.poll()
        assert isinstance(rig.nvml, UuidFailsAfterRegistering) and rig.watcher is not None
        rig.nvml.broken = True
        rig.faults([{"kind": "xid", "gpu": 2, "xid": 48}])
        deadline = time.monotonic() + 5
        events = ()
        while not events and time.monotonic() < deadline:
            time.sleep(0.02)
            events = rig.watcher.drain()
        assert [e.uuid for e in events] == [first.inventory.gpus[2].uuid]
    finally:
        rig.close()


def test_xid_of_an_unnamed_gpu_is_kept_at_node_level(tmp_path: Path) -> None:
    """Lost GPU: neither its UUID nor its index can be read when its XID arrives."""
    rig = Rig(tmp_path, profile="l40s-pcie-4", watch=True)
    try:
        rig.poll()
        rig.faults([{"kind": "lost", "gpu": 1}, {"kind": "xid", "gpu": 1, "xid": 79}])
        state = rig.poll_until_node_reason("xid 79", dt=1)  # within xid_hold_s
        assert any("xid 79" in r for r in state.health.reasons)
    finally:
        rig.close()
