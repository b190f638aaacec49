"""The simulated GPUs' model: their handles (`SimGpu`, `SimMig`), UUIDs and bus ids,
event objects, and the constants of the parts the profiles describe (MIG sizes, PCIe
generations, temperatures, a healthy fabric). `agent.sim.nvml` answers NVML calls
with them; nothing outside the simulator reads a handle's inside.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec
import pynvml

from agent.sim.faults import Faults
from agent.sim.profile import GpuSpec, HostProfile

# Memory a MIG instance reports on an 80 GB A100/H100, by profile name.
MIG_MEMORY_MIB = {
    "1g.10gb": 9856,
    "1g.20gb": 19968,
    "2g.20gb": 19968,
    "3g.40gb": 40192,
    "4g.40gb": 40192,
    "7g.80gb": 80896,
}
MIG_CAPABLE = {(8, 0), (9, 0), (10, 0)}
MAX_MIG_DEVICES = 7
MAX_PCIE_GEN = {(9, 0): 5, (10, 0): 6}  # others: Gen4
RESET_CLASSES = ("reset", "reset_degraded", "recovery")
HBM = {(7, 0), (8, 0), (9, 0), (10, 0)}  # data-centre parts: HBM with its own sensor
IDLE_C = 45  # GPU and memory temperature of an idle simulated GPU
THRESHOLDS = {
    pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: 92,
    pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: 89,
    pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX: 87,
}
HBM_MAX_C = 95  # NVML_TEMPERATURE_THRESHOLD_MEM_MAX on HBM parts
# healthMask of a healthy fabric: each 2-bit condition FALSE, configuration NONE.
HEALTHY_FABRIC_MASK = (
    pynvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_FALSE
    << pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW
    | pynvml.NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_RECOVERY_FALSE
    << pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_RECOVERY
    | pynvml.NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_UNHEALTHY_FALSE
    << pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY
    | pynvml.NVML_GPU_FABRIC_HEALTH_MASK_ACCESS_TIMEOUT_RECOVERY_FALSE
    << pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ACCESS_TIMEOUT_RECOVERY
    | pynvml.NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_NONE
    << pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_INCORRECT_CONFIGURATION
)


def nvml_error(code: int) -> Exception:
    return pynvml.NVMLError(code)  # type: ignore[no-any-return]


def sim_uuid(prefix: str, seed: str) -> str:
    h = hashlib.sha256(seed.encode()).hexdigest()
    return f"{prefix}-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def nvml_bus_id(pci: str) -> bytes:
    """NVML writes an 8-digit PCI domain; profiles use the 4-digit sysfs form."""
    domain, rest = pci.split(":", 1)
    return f"{int(domain, 16):08X}:{rest.upper()}".encode()


class SimGpu(msgspec.Struct, frozen=True):
    spec: GpuSpec
    uuid: str


class SimMig(msgspec.Struct, frozen=True):
    gpu: SimGpu
    slot: int
    profile: str
    uuid: str


class SimEvent(msgspec.Struct, frozen=True):
    device: Any
    eventType: int  # pynvml's field names
    eventData: int
    gpuInstanceId: int = 0
    computeInstanceId: int = 0


class SimEventSet(msgspec.Struct):
    generation: int
    gpus: set[int] = msgspec.field(default_factory=set)


def struct_of(arg: Any) -> Any:
    """The struct behind a `ctypes.pointer` argument (the reader passes one), or the
    struct itself."""
    return getattr(arg, "contents", arg)


FABRIC_VERSIONS = (pynvml.nvmlGpuFabricInfo_v2, pynvml.nvmlGpuFabricInfo_v3)


def fill_fabric(info: Any, gpu: SimGpu, profile: HostProfile, faults: Faults) -> None:
    """Fill a fabric info struct (any of its forms) as the driver does for `gpu`; raise
    NotSupported off an NVSwitch board or before Hopper. `fabric` faults for this GPU
    (or every GPU) set the state, status, health mask and summary."""
    switched = gpu.spec.nvlink_links and profile.nvswitch_pci
    if not switched or gpu.spec.compute_capability < (9, 0):
        raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
    found = [f for f in faults.on("fabric") if f.gpu in (None, gpu.spec.index)]
    info.state = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
    info.status = 0
    mask, summary = HEALTHY_FABRIC_MASK, pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY
    for fault in found:
        info.state = int(fault.state or 0)
        info.status = fault.status
        mask = fault.mask if fault.mask is not None else mask
        summary = fault.summary if fault.summary is not None else summary
    version = getattr(info, "version", None)
    if version in FABRIC_VERSIONS:
        info.healthMask = mask
    if version == pynvml.nvmlGpuFabricInfo_v3:
        info.healthSummary = summary
