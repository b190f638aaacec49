"""The simulated NVML and its fault file: profiles, exceptions, XID delivery."""

from __future__ import annotations

import ctypes
import json
import time
from pathlib import Path

import pynvml
import pytest

from agent.readings import XidEvent
from agent.sim.faults import FaultError, FaultFile, parse_faults, write_faults
from agent.sim.nvml import SimulatedNvml
from agent.sim.profile import ProfileError, load_profile, parse_profile, shipped_profiles
from agent.xid_watch import XidWatcher
from shared.clock import SystemClock


def started(profile: str, faults: Path | None = None) -> SimulatedNvml:
    nvml = SimulatedNvml(load_profile(profile), "n1", FaultFile(faults))
    nvml.nvmlInit()
    return nvml


def test_shipped_profiles() -> None:
    assert {"h100-sxm-8", "a100-mig-8", "l40s-pcie-4"} <= set(shipped_profiles())
    h100 = load_profile("h100-sxm-8")
    assert len(h100.gpus) == 8 and h100.gpus[0].memory_mib == 81559
    assert h100.gpus[0].name == "NVIDIA H100 80GB HBM3"
    assert sum(n.sriov_num_vfs > 0 for n in h100.nics) == 8
    assert [len(g.mig_profiles) > 0 for g in load_profile("a100-mig-8").gpus].count(True) == 2
    assert all(g.nvlink_links == 0 for g in load_profile("l40s-pcie-4").gpus)


def test_profile_by_path_and_errors_name_the_key(tmp_path: Path) -> None:
    path = tmp_path / "box.toml"
    path.write_text('id = "box"\n[gpu]\ncount = 1\nmemory_mib = 10\n')
    assert load_profile(str(path)).id == "box"
    with pytest.raises(ProfileError, match=r"gpu\.memory_mib"):
        parse_profile({"id": "x", "gpu": {"count": 1}})
    with pytest.raises(ProfileError, match=r"mig\[0\]\.gpu"):
        parse_profile({"id": "x", "gpu": {"count": 1, "memory_mib": 1}, "mig": [{"gpu": 3}]})
    with pytest.raises(ProfileError, match="unknown profile"):
        load_profile("no-such-box")


def test_uninitialised_and_unsupported_calls_raise_pynvml_errors() -> None:
    nvml = SimulatedNvml(load_profile("l40s-pcie-4"), "n1")
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetCount()
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetMigMode(handle)  # L40S has no MIG
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetNvLinkState(handle, 0)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetHandleByIndex(4)


def test_pci_info_uses_nvml_form() -> None:
    nvml = started("h100-sxm-8")
    info = nvml.nvmlDeviceGetPciInfo(nvml.nvmlDeviceGetHandleByIndex(0))
    assert info.busId == "00000000:18:00.0"


def test_fault_file_parsing() -> None:
    faults = parse_faults({"faults": [{"kind": "xid", "gpu": 1, "xid": 79}, {"kind": "nvml_down"}]})
    assert faults.has("xid", 1) and not faults.has("xid", 2) and faults.has("nvml_down")
    for bad, where in [
        ({"faults": [{"kind": "melt"}]}, "kind"),
        ({"faults": [{"kind": "xid", "gpu": 1}]}, "xid"),
        ({"faults": [{"kind": "dbe"}]}, "gpu"),
        ({"faults": [{"kind": "dbe", "gpu": "one"}]}, "gpu"),
        ([], "faults"),
    ]:
        with pytest.raises(FaultError, match=where):
            parse_faults(bad)


def test_bad_fault_file_counts_as_no_faults(tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    path.write_text("{not json")
    assert FaultFile(path).current().items == ()
    assert FaultFile(tmp_path / "missing.json").current().items == ()


def test_fault_file_reloads_on_every_replace(tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    ff = FaultFile(path)
    for gpu in range(5):  # same size each time, within one mtime tick
        write_faults(path, [{"kind": "lost", "gpu": gpu}])
        assert ff.current().has("lost", gpu)


def test_xid_delivered_once_and_again_after_re_adding(tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    nvml = started("h100-sxm-8", path)
    events = nvml.nvmlEventSetCreate()
    for i in range(8):
        nvml.nvmlDeviceRegisterEvents(
            nvml.nvmlDeviceGetHandleByIndex(i), pynvml.nvmlEventTypeXidCriticalError, events
        )
    xid = {"kind": "xid", "gpu": 2, "xid": 79}
    write_faults(path, [xid])
    data = nvml.nvmlEventSetWait(events, 100)
    assert data.eventData == 79
    assert nvml.nvmlDeviceGetUUID(data.device) == nvml.nvmlDeviceGetUUID(
        nvml.nvmlDeviceGetHandleByIndex(2)
    )
    with pytest.raises(pynvml.NVMLError_Timeout):
        nvml.nvmlEventSetWait(events, 100)
    write_faults(path, [xid, xid])  # a second identical entry fires once more
    assert nvml.nvmlEventSetWait(events, 100).eventData == 79
    write_faults(path, [])
    with pytest.raises(pynvml.NVMLError_Timeout):
        nvml.nvmlEventSetWait(events, 50)
    write_faults(path, [xid])
    assert nvml.nvmlEventSetWait(events, 100).eventData == 79


def test_xid_watcher_thread_queues_events(tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    nvml = started("l40s-pcie-4", path)
    watcher = XidWatcher(nvml, SystemClock(), wait_ms=50)
    assert watcher.start(range(4))
    try:
        path.write_text(json.dumps({"faults": [{"kind": "xid", "gpu": 3, "xid": 48}]}))
        events: tuple[XidEvent, ...] = ()
        deadline = time.monotonic() + 5
        while not events and time.monotonic() < deadline:
            time.sleep(0.02)
            events = watcher.drain()
        (event,) = events
        assert event.xid == 48
        assert event.uuid == nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(3))
    finally:
        watcher.stop()
    assert not watcher.running


def test_fabric_info_v_follows_the_struct_version() -> None:
    nvml = started("h100-sxm-8")
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
        nvml.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.pointer(pynvml.c_nvmlGpuFabricInfo_t()))
    v2 = pynvml.c_nvmlGpuFabricInfo_v2_t()
    nvml.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.pointer(v2))
    assert v2.state == pynvml.NVML_GPU_FABRIC_STATE_COMPLETED and v2.healthMask != 0
    v3 = pynvml.c_nvmlGpuFabricInfo_v3_t()
    nvml.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.pointer(v3))
    assert v3.healthSummary == pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY


def test_new_fault_kinds_name_their_missing_fields() -> None:
    for bad, where in [
        ({"faults": [{"kind": "temp", "gpu": 1}]}, "celsius"),
        ({"faults": [{"kind": "temp", "gpu": 1, "celsius": 90, "sensor": "vram"}]}, "sensor"),
        ({"faults": [{"kind": "nvswitch_down"}]}, "switch"),
    ]:
        with pytest.raises(FaultError, match=where):
            parse_faults(bad)


def test_device_index_of_a_handle() -> None:
    nvml = started("l40s-pcie-4")
    assert nvml.nvmlDeviceGetIndex(nvml.nvmlDeviceGetHandleByIndex(3)) == 3


def test_a_process_without_a_cgroup_runs_in_a_login_session() -> None:
    """The default cgroup is a path (a Struct's class attribute is not its default: the
    simulated host memory of every such process was looked up under a bogus path)."""
    (fault,) = parse_faults({"faults": [{"kind": "process", "pid": 7, "gpus": [0]}]}).items
    assert fault.workload is not None
    assert fault.workload.cgroup == "0::/user.slice/user-1000.slice/session-1.scope"
