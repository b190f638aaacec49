"""The DCGM health signals the agent reads through NVML (issue 24): each one from a fault
in the simulated NVML, through the real reader, health and poller, to the device's
status; and each one degrading to "unknown", never a crash, where the driver or GPU does
not support it."""

from __future__ import annotations

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
from agent.sim.sysfs_tree import build_tree
from agent.state import AgentState
from agent.sysfs import read_host
from shared.clock import FakeClock
from shared.ids import new_pool_id

V100 = """id = "v100-sxm2-2"
[gpu]
count = 2
name = "Tesla V100-SXM2-32GB"
memory_mib = 32768
compute_capability = [7, 0]
nvlink_links = 6
[nvswitch]
pci_bus_ids = ["0000:05:00.0"]
"""


def poll(
    tmp_path: Path,
    faults: list[dict[str, Any]],
    profile: str = "h100-sxm-8",
    nvml_class: type[SimulatedNvml] = SimulatedNvml,
) -> AgentState:
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "faults.json"
    write_faults(path, faults)
    prof = load_profile(profile)
    root = build_tree(tmp_path / "root", prof)
    return Poller(
        reader=NvmlReader(nvml_class(prof, "n1", FaultFile(path)), cpu_count=prof.vcpu),
        read_host=lambda: read_host(root),
        ident=Identity(node_id="n1", pool_id=new_pool_id(), profile_id=prof.id),
        clock=FakeClock(),
        boot_id="boot",
        policy=HealthPolicy(recover_after_s=10),
    ).poll_once()


def only(state: AgentState) -> tuple[int, str, str]:
    """(GPU index, status, first reason) of the one unhealthy or degraded device."""
    (device,) = state.devices
    index = next(g.index for g in state.inventory.gpus if g.uuid == device.device_id)
    return index, device.status, device.reasons[0]


@pytest.mark.parametrize(
    ("fault", "status", "reason"),
    [
        ({"kind": "inforom", "gpu": 1}, "degraded", "InfoROM corrupted"),
        ({"kind": "ecc_pending", "gpu": 1}, "degraded", "ECC mode change pending"),
        ({"kind": "temp", "gpu": 1, "celsius": 91}, "degraded", "GPU temperature 91 C"),
        (
            {"kind": "temp", "gpu": 1, "celsius": 96, "sensor": "hbm"},
            "degraded",
            "HBM temperature 96 C",
        ),
        ({"kind": "hw_slowdown", "gpu": 1}, "degraded", "hardware slowdown"),
        (
            {"kind": "fabric", "gpu": 1, "state": 3, "mask": 1},
            "degraded",
            "fabric: degraded bandwidth",
        ),
        (
            {"kind": "fabric", "gpu": 1, "state": 3, "mask": 1 << 4},
            "unhealthy",
            "fabric: route unhealthy",
        ),
        (
            {"kind": "fabric", "gpu": 1, "state": 3, "summary": 2},
            "unhealthy",
            "fabric: health summary unhealthy",
        ),
    ],
)
def test_each_signal_flags_its_gpu(
    tmp_path: Path, fault: dict[str, Any], status: str, reason: str
) -> None:
    index, got, why = only(poll(tmp_path, [fault]))
    assert (index, got) == (1, status)
    assert why.startswith(reason), why


def test_temperature_below_the_slowdown_threshold_is_fine(tmp_path: Path) -> None:
    state = poll(tmp_path, [{"kind": "temp", "gpu": 1, "celsius": 86}])
    assert state.devices == ()


def test_nvswitch_gone_is_unhealthy_on_every_gpu_it_served(tmp_path: Path) -> None:
    """One of the four NVSwitches of an HGX H100 down from the start: every GPU reaches
    three of four, whatever its link count says."""
    state = poll(tmp_path, [{"kind": "nvswitch_down", "switch": 2}])
    assert len(state.devices) == 8 and all(d.status == "unhealthy" for d in state.devices)
    assert any(r.startswith("NVSwitch: 3 of 4 reached") for r in state.devices[0].reasons), (
        state.devices[0].reasons
    )
    assert state.health.status == "unhealthy"


def test_retired_pages_of_both_causes_count(tmp_path: Path) -> None:
    profile = tmp_path / "v100.toml"
    profile.write_text(V100)
    state = poll(tmp_path, [{"kind": "retired", "gpu": 0, "count": 61}], profile=str(profile))
    assert only(state) == (0, "unhealthy", "retired pages: 61")
    healthy = poll(tmp_path / "b", [{"kind": "retired", "gpu": 0, "count": 5}], str(profile))
    assert healthy.devices == ()


class NothingSupported(SimulatedNvml):
    """A driver or GPU without any of the newer signals."""

    def _no(self, *args: Any) -> Any:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    nvmlDeviceValidateInforom = _no
    nvmlDeviceGetEccMode = _no
    nvmlDeviceGetTemperature = _no
    nvmlDeviceGetTemperatureThreshold = _no
    nvmlDeviceGetNvLinkRemoteDeviceType = _no
    nvmlDeviceGetGpuFabricInfoV = _no


class OldDriver(SimulatedNvml):
    """No nvmlDeviceGetGpuFabricInfoV (FunctionNotFound): the older call still answers."""

    def nvmlDeviceGetGpuFabricInfoV(self, handle: Any, gpuFabricInfo: Any) -> int:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)


@pytest.mark.parametrize("nvml_class", [NothingSupported, OldDriver])
def test_unsupported_signals_degrade_to_unknown(
    tmp_path: Path, nvml_class: type[SimulatedNvml]
) -> None:
    state = poll(tmp_path, [], nvml_class=nvml_class)
    assert state.health.status == "healthy" and state.devices == ()
    snap = NvmlReader(nvml_class(load_profile("h100-sxm-8"), "n1")).read()
    c = snap.counters[0]
    if nvml_class is NothingSupported:
        assert (c.inforom_corrupt, c.ecc_mode, c.temperature, c.fabric_health) == (
            None,
            None,
            None,
            None,
        )


def test_old_driver_still_sees_fabric_manager_state(tmp_path: Path) -> None:
    state = poll(tmp_path, [{"kind": "fabric", "state": 1}], nvml_class=OldDriver)
    assert state.health.status == "unhealthy"


class CountsInforom(SimulatedNvml):
    validations = 0

    def nvmlDeviceValidateInforom(self, handle: Any) -> None:
        self.validations += 1
        super().nvmlDeviceValidateInforom(handle)


def test_inforom_is_validated_every_n_reads_and_a_corruption_is_seen(tmp_path: Path) -> None:
    path = tmp_path / "faults.json"
    nvml = CountsInforom(load_profile("l40s-pcie-4"), "n1", FaultFile(path))
    reader = NvmlReader(nvml, inforom_every=3)
    reader.read()
    write_faults(path, [{"kind": "inforom", "gpu": 0}])
    flags = [reader.read().counters[0].inforom_corrupt for _ in range(3)]
    assert flags[-1] is True and flags[0] is False  # seen within 3 reads, not at once
    assert nvml.validations == 2 * 4  # two validations of each of the 4 GPUs in 4 reads
