"""A simulated NVML built from a host profile, with faults injected from a file.

It implements the `NvmlLike` names and raises pynvml's own exception classes wherever
a real driver would (`NVMLError_NotSupported` for counters the GPU generation lacks,
`NVMLError_GpuIsLost` for a lost GPU, `NVMLError_Timeout` from an idle event wait), so
the agent's guarded paths run in tests exactly as on a host. GPU and MIG UUIDs are
derived from the node id, so simulated agents of one profile never share a UUID.

Like the driver, it keeps state a fault file cannot express: delivering a reset-class XID
sets the GPU's recovery action (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION) until a `reset`
fault, the GPU being lost, or NVML going down clears it; and every NVML session after the
driver went away makes the event sets of older sessions dead (they never deliver again).
Fault `gpu` numbers are the profile's (physical) GPUs, not NVML indices, which move down
when an earlier GPU is `absent`.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pynvml

from agent.sim.faults import FaultFile, Faults
from agent.sim.profile import GpuSpec, HostProfile
from agent.sim.workload import FakeProcs, Workload
from agent.xid import CATALOGUE

# Memory a MIG instance reports on an 80 GB A100/H100, by profile name.
_MIG_MEMORY_MIB = {
    "1g.10gb": 9856,
    "1g.20gb": 19968,
    "2g.20gb": 19968,
    "3g.40gb": 40192,
    "4g.40gb": 40192,
    "7g.80gb": 80896,
}
_MIG_CAPABLE = {(8, 0), (9, 0), (10, 0)}
_MAX_MIG_DEVICES = 7
_MAX_PCIE_GEN = {(9, 0): 5, (10, 0): 6}  # others: Gen4
_RESET_CLASSES = ("reset", "reset_degraded", "recovery")
_HBM = {(7, 0), (8, 0), (9, 0), (10, 0)}  # data-centre parts: HBM with its own sensor
_IDLE_C = 45  # GPU and memory temperature of an idle simulated GPU
_THRESHOLDS = {
    pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: 92,
    pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: 89,
    pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX: 87,
}
_HBM_MAX_C = 95  # NVML_TEMPERATURE_THRESHOLD_MEM_MAX on HBM parts
# healthMask of a healthy fabric: each 2-bit condition FALSE, configuration NONE.
_HEALTHY_FABRIC_MASK = (
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


def _err(code: int) -> Exception:
    return pynvml.NVMLError(code)  # type: ignore[no-any-return]


def _uuid(prefix: str, seed: str) -> str:
    h = hashlib.sha256(seed.encode()).hexdigest()
    return f"{prefix}-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _nvml_bus_id(pci: str) -> bytes:
    """NVML writes an 8-digit PCI domain; profiles use the 4-digit sysfs form."""
    domain, rest = pci.split(":", 1)
    return f"{int(domain, 16):08X}:{rest.upper()}".encode()


@dataclass(frozen=True)
class _Gpu:
    spec: GpuSpec
    uuid: str


@dataclass(frozen=True)
class _Mig:
    gpu: _Gpu
    slot: int
    profile: str
    uuid: str


@dataclass(frozen=True)
class _Event:
    device: Any
    eventType: int  # pynvml's field names
    eventData: int
    gpuInstanceId: int = 0
    computeInstanceId: int = 0


@dataclass
class _EventSet:
    generation: int
    gpus: set[int] = field(default_factory=set)


_NO_INSTANCE = 0xFFFFFFFF  # gpuInstanceId/computeInstanceId of a process off MIG
_MIB = 1024 * 1024


class SimulatedNvml:
    def __init__(
        self,
        profile: HostProfile,
        node_id: str,
        faults: FaultFile | None = None,
        proc_root: Path | None = None,
        clock: Callable[[], float] = time.time,
    ):
        """`proc_root`: where the workloads' fake `/proc/<pid>` entries are kept (none
        written without it); `clock`: seconds, for the workloads' utilization curves and
        process sample time stamps."""
        self.profile = profile
        self._faults = faults or FaultFile(None)
        self._procs = FakeProcs(proc_root) if proc_root is not None else None
        self._clock = clock
        self._started: dict[str, float] = {}  # workload entry key -> when first seen
        self._synced: tuple[Workload, ...] | None = None
        self._gpus = [
            _Gpu(spec, _uuid("GPU", f"{node_id}/{profile.id}/{spec.index}"))
            for spec in profile.gpus
        ]
        self._initialised = 0
        self._generation = 0
        self._down_seen = False
        self._recovery: dict[int, int] = {}  # physical GPU -> pending recovery action
        self._delivered: set[str] = set()
        self._lock = threading.Lock()
        self.calls = 0  # counted so tests and benchmarks can see the cost of a poll

    # -- helpers ----------------------------------------------------------------------------

    def faults(self) -> Faults:
        return self._faults.current()

    def _ready(self) -> Faults:
        self.calls += 1
        faults = self.faults()
        if faults.has("nvml_down"):
            self._down_seen = True
            self._recovery.clear()  # a driver reload resets every GPU
            raise _err(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
        if self._initialised <= 0:
            raise _err(pynvml.NVML_ERROR_UNINITIALIZED)
        return faults

    def _gpu(self, handle: Any) -> _Gpu:
        faults = self._ready()
        gpu = handle.gpu if isinstance(handle, _Mig) else handle
        if not isinstance(gpu, _Gpu):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if faults.has("lost", gpu.spec.index):
            self._recovery.pop(gpu.spec.index, None)  # it comes back reset, or not at all
            raise _err(pynvml.NVML_ERROR_GPU_IS_LOST)
        return gpu

    def _visible(self, faults: Faults) -> list[_Gpu]:
        return [g for g in self._gpus if not faults.has("absent", g.spec.index)]

    def _whole(self, handle: Any) -> _Gpu:
        if isinstance(handle, _Mig):
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self._gpu(handle)

    # -- system -----------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.calls += 1
        if self.faults().has("nvml_down"):
            self._down_seen = True
            raise _err(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
        if self._initialised <= 0 or self._down_seen:
            self._generation += 1
            self._initialised = 0
            self._down_seen = False
        self._initialised += 1

    def nvmlShutdown(self) -> None:
        self._ready()
        self._initialised -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._ready()
        return self.profile.driver_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._ready()
        return self.profile.cuda_version

    def nvmlDeviceGetCount(self) -> int:
        return len(self._visible(self._ready()))

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        faults = self._ready()
        visible = self._visible(faults)
        if not 0 <= index < len(visible):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = visible[index]
        for fault in faults.on("handle_error", gpu.spec.index):
            code = getattr(pynvml, f"NVML_ERROR_{fault.error.upper()}", pynvml.NVML_ERROR_UNKNOWN)
            raise _err(int(code))
        return gpu

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        gpu = self._whole(handle)
        return self._visible(self.faults()).index(gpu)

    # -- identity ---------------------------------------------------------------------------

    def nvmlDeviceGetName(self, handle: Any) -> str:
        gpu = self._gpu(handle)
        if isinstance(handle, _Mig):
            return f"{gpu.spec.name} MIG {handle.profile}"
        return gpu.spec.name

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        gpu = self._gpu(handle)
        return handle.uuid if isinstance(handle, _Mig) else gpu.uuid

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        gpu = self._gpu(handle)
        if isinstance(handle, _Mig):
            mib = _MIG_MEMORY_MIB.get(handle.profile, 0)
        else:
            mib = gpu.spec.memory_mib
        total = mib * _MIB
        used = min(total, sum(w.memory_mib for w, _ in self._running(handle)) * _MIB)
        return pynvml.c_nvmlMemory_t(total=total, free=total - used, used=used)

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        gpu = self._whole(handle)
        info = pynvml.nvmlPciInfo_t()
        info.busId = _nvml_bus_id(gpu.spec.pci_bus_id)
        return info

    def nvmlDeviceGetNumaNodeId(self, handle: Any) -> int:
        return self._whole(handle).spec.numa_node

    def nvmlDeviceGetCpuAffinity(self, handle: Any, cpuSetSize: int) -> Any:
        numa = self._whole(handle).spec.numa_node
        per_node = self.profile.vcpu // self.profile.numa_nodes
        words = [0] * cpuSetSize
        for cpu in range(numa * per_node, (numa + 1) * per_node):
            if cpu // 64 < cpuSetSize:
                words[cpu // 64] |= 1 << (cpu % 64)
        return words

    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]:
        return self._gpu(handle).spec.compute_capability

    # -- MIG --------------------------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        gpu = self._whole(device)
        if gpu.spec.compute_capability not in _MIG_CAPABLE:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        mode = 1 if gpu.spec.mig_profiles else 0
        pending = 1 - mode if self.faults().has("mig_pending", gpu.spec.index) else mode
        return [mode, pending]

    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> int:
        gpu = self._whole(device)
        return _MAX_MIG_DEVICES if gpu.spec.compute_capability in _MIG_CAPABLE else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> Any:
        gpu = self._whole(device)
        if not 0 <= index < len(gpu.spec.mig_profiles):
            raise _err(pynvml.NVML_ERROR_NOT_FOUND)
        profile = gpu.spec.mig_profiles[index]
        return _Mig(gpu, index, profile, _uuid("MIG", f"{gpu.uuid}/{index}"))

    def nvmlDeviceGetGpuInstanceId(self, device: Any) -> int:
        self._gpu(device)
        if not isinstance(device, _Mig):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return device.slot + 1

    def nvmlDeviceGetComputeInstanceId(self, device: Any) -> int:
        self._gpu(device)
        if not isinstance(device, _Mig):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return 0

    # -- use: processes and utilization -----------------------------------------------------

    def _workloads(self) -> list[tuple[str, Workload]]:
        """The fault file's workloads (keyed by entry), their fake /proc entries kept."""
        entries = [(f.key, f.workload) for f in self.faults().on("process") if f.workload]
        now = self._clock()
        for key, _ in entries:
            self._started.setdefault(key, now)
        work = tuple(w for _, w in entries)
        if self._procs is not None and work != self._synced:
            self._procs.sync(work)
            self._synced = work
        return entries

    def _running(self, handle: Any) -> list[tuple[Workload, int]]:
        """(workload, its utilization now) for each process on this GPU or MIG device."""
        gpu = self._gpu(handle)
        migs = bool(gpu.spec.mig_profiles)
        now = self._clock()
        out: list[tuple[Workload, int]] = []
        for key, work in self._workloads():
            if gpu.spec.index not in work.gpus:
                continue
            slot = (work.mig or 0) if migs else None
            if isinstance(handle, _Mig) and slot != handle.slot:
                continue
            out.append((work, work.util.at(now - self._started[key])))
        return out

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        """pynvml's v3 call: friendly objects of `c_nvmlProcessInfo_v3_t`'s fields."""
        gpu = self._gpu(handle)
        out = []
        for work, _ in self._running(handle):
            gi = ci = _NO_INSTANCE
            if gpu.spec.mig_profiles:
                gi, ci = (work.mig or 0) + 1, 0
            info = pynvml.c_nvmlProcessInfo_v3_t(
                pid=work.pid,
                usedGpuMemory=work.memory_mib * _MIB,
                gpuInstanceId=gi,
                computeInstanceId=ci,
            )
            out.append(pynvml.nvmlStructToFriendlyObject(info))
        return out

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        """Not supported on MIG devices, nor on a GPU in MIG mode, as with the driver."""
        gpu = self._gpu(handle)
        if isinstance(handle, _Mig) or gpu.spec.mig_profiles:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        sm = min(100, sum(u for _, u in self._running(handle)))
        return pynvml.c_nvmlUtilization_t(gpu=sm, memory=sm // 2)

    def nvmlDeviceGetProcessUtilization(self, handle: Any, timeStamp: int) -> list[Any]:
        """A sample per busy process, newer than `timeStamp` (µs); NotFound when none."""
        gpu = self._gpu(handle)
        if isinstance(handle, _Mig) or gpu.spec.mig_profiles:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        now_us = int(self._clock() * 1_000_000)
        samples = [
            pynvml.c_nvmlProcessUtilizationSample_t(
                pid=work.pid, timeStamp=now_us, smUtil=util, memUtil=util // 2
            )
            for work, util in self._running(handle)
            if util > 0 and now_us > timeStamp
        ]
        if not samples:
            raise _err(pynvml.NVML_ERROR_NOT_FOUND)
        return samples

    # -- NVLink and fabric ------------------------------------------------------------------

    def nvmlDeviceGetNvLinkState(self, device: Any, link: int) -> int:
        gpu = self._whole(device)
        if gpu.spec.nvlink_links == 0:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= link < gpu.spec.nvlink_links:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        faults = self.faults()
        for fault in faults.on("nvlink_down", gpu.spec.index):
            if fault.link is None or fault.link == link:
                return 0
        switches = len(self.profile.nvswitch_pci)
        if any(f.switch == link % max(switches, 1) for f in faults.on("nvswitch_down")):
            return 0
        return 1

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Any, link: int) -> int:
        if not self.nvmlDeviceGetNvLinkState(handle, link):
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if self.profile.nvswitch_pci:
            return int(pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH)
        return int(pynvml.NVML_NVLINK_DEVICE_TYPE_GPU)

    def nvmlDeviceGetNvLinkRemotePciInfo(self, device: Any, link: int) -> Any:
        if not self.nvmlDeviceGetNvLinkState(device, link):
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        switches = self.profile.nvswitch_pci
        info = pynvml.nvmlPciInfo_t()
        info.busId = _nvml_bus_id(switches[link % len(switches)])
        return info

    def nvmlDeviceGetGpuFabricInfo(self, device: Any, gpuFabricInfo: Any) -> int:
        """Hopper and later GPUs on an NVSwitch board report the Fabric Manager's state
        (completed/success once FM has run; no cluster UUID: not a multi-node fabric)."""
        self._fabric(device, _struct(gpuFabricInfo))
        return 0

    def nvmlDeviceGetGpuFabricInfoV(self, device: Any, gpuFabricInfo: Any) -> int:
        """The versioned call: a `c_nvmlGpuFabricInfo_v2_t` (adds healthMask) or `_v3_t`
        (adds healthSummary), told apart by its `version` field, like the driver."""
        info = _struct(gpuFabricInfo)
        version = getattr(info, "version", None)
        if version not in (pynvml.nvmlGpuFabricInfo_v2, pynvml.nvmlGpuFabricInfo_v3):
            raise _err(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        gpu = self._fabric(device, info)
        info.healthMask = _HEALTHY_FABRIC_MASK
        summary = pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY
        for fault in self._fabric_faults(gpu):
            info.healthMask = fault.mask if fault.mask is not None else info.healthMask
            summary = fault.summary if fault.summary is not None else summary
        if version == pynvml.nvmlGpuFabricInfo_v3:
            info.healthSummary = summary
        return 0

    def _fabric_faults(self, gpu: _Gpu) -> list[Any]:
        return [f for f in self.faults().on("fabric") if f.gpu in (None, gpu.spec.index)]

    def _fabric(self, handle: Any, info: Any) -> _Gpu:
        gpu = self._whole(handle)
        switched = gpu.spec.nvlink_links and self.profile.nvswitch_pci
        if not switched or gpu.spec.compute_capability < (9, 0):
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        info.state = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
        info.status = 0
        for fault in self._fabric_faults(gpu):
            info.state = int(fault.state or 0)
            info.status = fault.status
        return gpu

    # -- InfoROM, ECC mode, temperatures ----------------------------------------------------

    def nvmlDeviceValidateInforom(self, handle: Any) -> None:
        gpu = self._whole(handle)
        if self.faults().has("inforom", gpu.spec.index):
            raise _err(pynvml.NVML_ERROR_CORRUPTED_INFOROM)

    def nvmlDeviceGetEccMode(self, handle: Any) -> list[int]:
        gpu = self._whole(handle)
        pending = 0 if self.faults().has("ecc_pending", gpu.spec.index) else 1
        return [1, pending]

    def _celsius(self, gpu: _Gpu, sensor: str) -> int:
        found = [f.celsius for f in self.faults().on("temp", gpu.spec.index) if f.sensor == sensor]
        return max(found, default=_IDLE_C)

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        gpu = self._whole(handle)
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._celsius(gpu, "gpu")

    def nvmlDeviceGetTemperatureThreshold(self, handle: Any, threshold: int) -> int:
        gpu = self._whole(handle)
        if threshold == pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX:
            if gpu.spec.compute_capability not in _HBM:
                raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
            return _HBM_MAX_C
        if threshold not in _THRESHOLDS:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return _THRESHOLDS[threshold]

    # -- health counters --------------------------------------------------------------------

    def nvmlDeviceGetTotalEccErrors(
        self,
        handle: Any,
        errorType: int,
        counterType: int,
    ) -> int:
        gpu = self._whole(handle)
        if errorType != pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
            return 0
        if counterType != pynvml.NVML_VOLATILE_ECC:
            return 0
        return sum(f.count for f in self.faults().on("dbe", gpu.spec.index))

    def _has_remapping(self, gpu: _Gpu) -> bool:
        return gpu.spec.compute_capability >= (8, 0)

    def nvmlDeviceGetRetiredPages(self, device: Any, sourceFilter: int) -> list[int]:
        gpu = self._whole(device)
        if self._has_remapping(gpu):
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        faults = self.faults()
        if sourceFilter == pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS:
            count = sum(f.count for f in faults.on("retired", gpu.spec.index))
            return [0x100000 + 0x1000 * i for i in range(count)]
        if sourceFilter != pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR:
            return []
        return [0x1000 * (i + 1) for i, _ in enumerate(faults.on("dbe", gpu.spec.index))]

    def nvmlDeviceGetRetiredPagesPendingStatus(self, device: Any) -> int:
        gpu = self._whole(device)
        if self._has_remapping(gpu):
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return int(self.faults().has("retired_pending", gpu.spec.index))

    def nvmlDeviceGetRemappedRows(self, device: Any) -> tuple[int, int, int, int]:
        gpu = self._whole(device)
        if not self._has_remapping(gpu):
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        faults = self.faults()
        pending = int(faults.has("remap_pending", gpu.spec.index))
        failure = int(faults.has("remap_failure", gpu.spec.index))
        return (0, len(faults.on("dbe", gpu.spec.index)), pending, failure)

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        gpu = self._whole(handle)
        faults = self.faults()
        # A `pcie` fault with a lower generation stands for a GPU under load: idle GPUs
        # lower their link generation to save power, which is not a fault.
        busy = any(f.gen is not None for f in faults.on("pcie", gpu.spec.index))
        bits = 0 if busy else int(pynvml.nvmlClocksThrottleReasonGpuIdle)
        if faults.has("thermal", gpu.spec.index):
            bits |= int(pynvml.nvmlClocksThrottleReasonHwThermalSlowdown)
        if faults.has("power", gpu.spec.index):
            bits |= int(pynvml.nvmlClocksThrottleReasonHwPowerBrakeSlowdown)
        if faults.has("hw_slowdown", gpu.spec.index):
            bits |= int(pynvml.nvmlClocksEventReasonHwSlowdown)
        return bits

    # -- PCIe and field values ---------------------------------------------------------------

    def _pcie(self, gpu: _Gpu, attr: str) -> int | None:
        for fault in self.faults().on("pcie", gpu.spec.index):
            value = getattr(fault, attr)
            if value is not None:
                return int(value)
        return None

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any) -> int:
        return _MAX_PCIE_GEN.get(self._whole(handle).spec.compute_capability, 4)

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any) -> int:
        gen = self._pcie(self._whole(handle), "gen")
        return gen if gen is not None else self.nvmlDeviceGetMaxPcieLinkGeneration(handle)

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any) -> int:
        self._whole(handle)
        return 16

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any) -> int:
        width = self._pcie(self._whole(handle), "width")
        return width if width is not None else 16

    def nvmlDeviceGetFieldValues(self, handle: Any, fieldIds: list[int]) -> Any:
        gpu = self._whole(handle)
        faults = self.faults()
        if faults.has("reset", gpu.spec.index):
            self._recovery.pop(gpu.spec.index, None)
        n = gpu.spec.index
        known: dict[int, int | None] = {
            pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER: sum(
                f.count for f in faults.on("pcie_replay", n)
            ),
            pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: self._recovery.get(n, 0),
        }
        if gpu.spec.compute_capability in _HBM:
            known[pynvml.NVML_FI_DEV_MEMORY_TEMP] = self._celsius(gpu, "hbm")
        if gpu.spec.nvlink_links:
            known[pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT] = gpu.spec.nvlink_links
            crc = sum(f.count for f in faults.on("nvlink_crc", n))
            known[pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL] = crc
            known[pynvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL] = 0
            known[pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL] = sum(
                f.count for f in faults.on("nvlink_replay", n)
            )
            known[pynvml.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL] = sum(
                f.count for f in faults.on("nvlink_recovery", n)
            )
        values = (pynvml.c_nvmlFieldValue_t * len(fieldIds))()
        for i, field_id in enumerate(fieldIds):
            values[i].fieldId = field_id
            value = known.get(field_id)
            if value is None:
                values[i].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
                continue
            values[i].nvmlReturn = 0
            values[i].valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
            values[i].value.ullVal = value
        return values

    # -- XID events -------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> Any:
        self._ready()
        return _EventSet(self._generation)

    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None:
        gpu = self._whole(handle)
        if not isinstance(eventSet, _EventSet) or eventSet.generation != self._generation:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if eventTypes & pynvml.nvmlEventTypeXidCriticalError:
            with self._lock:
                eventSet.gpus.add(gpu.spec.index)

    def nvmlEventSetWait(self, eventSet: Any, timeoutms: int) -> Any:
        if not isinstance(eventSet, _EventSet):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        deadline = time.monotonic() + timeoutms / 1000
        while True:
            event = self._next_xid(eventSet)
            if event is not None:
                return event
            left = deadline - time.monotonic()
            if left <= 0:
                raise _err(pynvml.NVML_ERROR_TIMEOUT)
            # Without a fault file no event can come: sleep the whole wait, like the driver.
            time.sleep(min(left, 0.1) if self._faults.watching else left)

    def _next_xid(self, eventSet: _EventSet) -> _Event | None:
        faults = self._ready()
        if eventSet.generation != self._generation:
            return None  # made in an older NVML session: dead, like the driver's
        with self._lock:
            present = {f.key for f in faults.on("xid")}
            self._delivered &= present  # a removed entry may fire again when re-added
            for fault in faults.on("xid"):
                if fault.key in self._delivered or fault.gpu not in eventSet.gpus:
                    continue
                if fault.gpu is None or not 0 <= fault.gpu < len(self._gpus):
                    continue
                self._delivered.add(fault.key)
                cls = CATALOGUE.get(fault.xid, ("other", ""))[0]
                if cls in _RESET_CLASSES:
                    action = (
                        pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT
                        if fault.xid == 79
                        else pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET
                    )
                    self._recovery[fault.gpu] = max(self._recovery.get(fault.gpu, 0), action)
                return _Event(
                    device=self._gpus[fault.gpu],
                    eventType=int(pynvml.nvmlEventTypeXidCriticalError),
                    eventData=fault.xid,
                )
        return None

    def nvmlEventSetFree(self, eventSet: Any) -> None:
        if isinstance(eventSet, _EventSet):
            with self._lock:
                eventSet.gpus.clear()


def _struct(arg: Any) -> Any:
    """The struct behind a `ctypes.pointer` argument (the reader passes one), or the
    struct itself."""
    return getattr(arg, "contents", arg)
