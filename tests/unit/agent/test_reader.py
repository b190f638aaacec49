"""The NVML reader over the simulated NVML: guarded calls, lost GPUs, NVLink state.

The only test doubles here sit at the NVML boundary: subclasses of the simulated NVML
that make chosen calls fail the way a real driver does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pynvml
import pytest

from agent.health import fabric_findings
from agent.reader import NvmlReader, cpu_list
from agent.sim.faults import FaultFile, write_faults
from agent.sim.nvml import SimulatedNvml
from agent.sim.profile import load_profile
from shared.ids import normalize_pci


def sim(profile: str = "h100-sxm-8", faults: Path | None = None) -> SimulatedNvml:
    return SimulatedNvml(load_profile(profile), "n1", FaultFile(faults))


class NoNumaNoName(SimulatedNvml):
    """A driver that does not support NUMA ids and fails names with an odd error."""

    def nvmlDeviceGetNumaNodeId(self, handle: Any) -> int:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetName(self, handle: Any) -> str:
        raise RuntimeError("binding broke")


class NoInit(SimulatedNvml):
    def nvmlInit(self) -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)


def test_reads_every_gpu_with_pci_in_sysfs_form() -> None:
    snap = NvmlReader(sim(), cpu_count=224).read()
    assert snap.error is None and snap.problems == ()
    assert [g.index for g in snap.gpus] == list(range(8))
    assert snap.gpus[0].pci_bus_id == "0000:18:00.0"
    assert snap.gpus[4].cpu_affinity == "56-111,168-223"  # socket 1: both threads
    assert len(snap.gpus[0].nvlink_active) == 18
    assert len(snap.counters) == 8 and not any(c.lost for c in snap.counters)
    # H100 uses row remapping: retired pages are "not supported", which is no problem.
    assert snap.counters[0].retired_pages is None and snap.counters[0].remap_failure is False


def test_unsupported_and_broken_calls_degrade_to_absent_values(
    caplog: pytest.LogCaptureFixture,
) -> None:
    nvml = NoNumaNoName(load_profile("l40s-pcie-4"), "n1")
    reader = NvmlReader(nvml)
    snap = reader.read()
    assert len(snap.gpus) == 4
    assert all(g.numa_node is None and g.name == "unknown" for g in snap.gpus)
    assert any("numa node: NVMLError_NotSupported" in p for p in snap.problems)
    assert any("binding broke" in p for p in snap.problems)
    logged = len(caplog.records)
    reader.read()
    assert len(caplog.records) == logged  # each problem is logged once, not every poll


def test_nvml_that_cannot_start_is_an_error_not_a_crash() -> None:
    snap = NvmlReader(NoInit(load_profile("l40s-pcie-4"), "n1")).read()
    assert snap.error is not None and "LibraryNotFound" in snap.error
    assert snap.gpus == ()


def test_lost_gpu_keeps_last_reading_and_reports_lost(tmp_path: Path) -> None:
    faults = tmp_path / "f.json"
    reader = NvmlReader(sim(faults=faults))
    first = reader.read()
    write_faults(faults, [{"kind": "lost", "gpu": 2}])
    snap = reader.read()
    assert snap.lost == (2,)
    assert [g.uuid for g in snap.gpus] == [g.uuid for g in first.gpus]
    lost = [c for c in snap.counters if c.lost]
    assert [c.uuid for c in lost] == [first.gpus[2].uuid]


def test_nvlink_down_is_a_counter_and_keeps_topology(tmp_path: Path) -> None:
    faults = tmp_path / "f.json"
    reader = NvmlReader(sim(faults=faults))
    first = reader.read()
    write_faults(faults, [{"kind": "nvlink_down", "gpu": 1, "link": 3}])
    snap = reader.read()
    assert snap.counters[1].nvlink_down == (3,)
    assert snap.counters[0].nvlink_down == ()
    assert snap.gpus[1].nvlink_remotes == first.gpus[1].nvlink_remotes
    write_faults(faults, [])
    assert reader.read().counters[1].nvlink_down == ()


def test_counters_follow_faults(tmp_path: Path) -> None:
    faults = tmp_path / "f.json"
    reader = NvmlReader(sim(faults=faults))
    write_faults(
        faults,
        [
            {"kind": "dbe", "gpu": 0, "count": 3},
            {"kind": "thermal", "gpu": 1},
            {"kind": "power", "gpu": 2},
            {"kind": "remap_failure", "gpu": 3},
            {"kind": "remap_pending", "gpu": 4},
        ],
    )
    c = reader.read().counters
    assert c[0].dbe_volatile == 3
    assert c[1].thermal_slowdown and not c[1].power_slowdown
    assert c[2].power_slowdown and not c[2].thermal_slowdown
    assert c[3].remap_failure and c[4].remap_pending
    assert c[5] == type(c[5])(
        index=5,
        uuid=c[5].uuid,
        dbe_volatile=0,
        remap_pending=False,
        remap_failure=False,
        idle=True,
        pcie_gen=(5, 5),
        pcie_width=(16, 16),
        pcie_replays=0,
        nvlink_errors=(("crc_flit", 0), ("crc_data", 0), ("replay", 0), ("recovery", 0)),
        recovery_action=0,
        inforom_corrupt=False,
        ecc_mode=(1, 1),
        temperature=(45, 89),
        hbm_temperature=(45, 95),
        nvswitches=(4, 4),
        fabric_health=c[5].fabric_health,
    )
    # A healthy fabric: every flag of the mask reads "false", the summary "healthy".
    assert c[5].fabric_health is not None and c[5].fabric_health[1] == 1
    assert fabric_findings(*c[5].fabric_health) == []


def test_nvml_down_midway_then_back(tmp_path: Path) -> None:
    faults = tmp_path / "f.json"
    reader = NvmlReader(sim(faults=faults))
    assert reader.read().error is None
    write_faults(faults, [{"kind": "nvml_down"}])
    assert reader.read().error is not None
    write_faults(faults, [])
    assert reader.read().error is None


def test_helpers() -> None:
    assert normalize_pci("00000000:1A:00.0") == "0000:1a:00.0"
    assert normalize_pci("0000:1a:00.0") == "0000:1a:00.0"
    assert cpu_list([0b1111, 1 << 63]) == "0-3,127"
    assert cpu_list([0]) == ""


# -- NVLink judged against the expected link count ------------------------------------------


class NoLinkCountField(SimulatedNvml):
    """A driver without NVML_FI_DEV_NVLINK_LINK_COUNT: the model's link count decides."""

    def nvmlDeviceGetFieldValues(self, handle: Any, fieldIds: list[int]) -> Any:
        values = super().nvmlDeviceGetFieldValues(handle, fieldIds)
        for v in values:
            if v.fieldId == pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT:
                v.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return values


@pytest.mark.parametrize("nvml_class", [SimulatedNvml, NoLinkCountField])
def test_link_already_down_at_start_is_down(
    tmp_path: Path, nvml_class: type[SimulatedNvml]
) -> None:
    faults = tmp_path / "f.json"
    write_faults(faults, [{"kind": "nvlink_down", "gpu": 1, "link": 3}])
    reader = NvmlReader(nvml_class(load_profile("h100-sxm-8"), "n1", FaultFile(faults)))
    snap = reader.read()
    assert snap.counters[1].nvlink_down == (3,)
    assert snap.counters[0].nvlink_down == ()


@pytest.mark.parametrize("nvml_class", [SimulatedNvml, NoLinkCountField])
def test_every_link_down_at_start_is_every_link_down(
    tmp_path: Path, nvml_class: type[SimulatedNvml]
) -> None:
    faults = tmp_path / "f.json"
    write_faults(faults, [{"kind": "nvlink_down", "gpu": 2}])
    reader = NvmlReader(nvml_class(load_profile("a100-mig-8"), "n1", FaultFile(faults)))
    assert reader.read().counters[2].nvlink_down == tuple(range(12))


def test_links_the_driver_no_longer_lists_are_down(tmp_path: Path) -> None:
    """A GPU whose links 12-17 answer NotSupported after a bad boot (the driver trained
    only 12): the field still says 18, so six links are down."""

    class TwelveLinks(SimulatedNvml):
        def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:
            if link >= 12:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
            return super().nvmlDeviceGetNvLinkState(handle, link)

    snap = NvmlReader(TwelveLinks(load_profile("h100-sxm-8"), "n1")).read()
    assert snap.counters[0].nvlink_down == tuple(range(12, 18))


def test_no_nvlink_gpu_has_no_down_links() -> None:
    snap = NvmlReader(sim("l40s-pcie-4")).read()
    assert all(c.nvlink_down == () for c in snap.counters)
