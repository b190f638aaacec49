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
when an earlier GPU is `absent`. The simulated parts and their handles are
`agent.sim.devices`, XID delivery `agent.sim.events`, workloads `agent.sim.workload`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml

from agent.sim.devices import (
    FABRIC_VERSIONS,
    HBM,
    HBM_MAX_C,
    IDLE_C,
    MAX_MIG_DEVICES,
    MAX_PCIE_GEN,
    MIG_CAPABLE,
    MIG_MEMORY_MIB,
    THRESHOLDS,
    SimEventSet,
    SimGpu,
    SimMig,
    fill_fabric,
    nvml_bus_id,
    nvml_error,
    sim_uuid,
    struct_of,
)
from agent.sim.events import XidDelivery
from agent.sim.faults import FaultFile, Faults
from agent.sim.profile import HostProfile
from agent.sim.workload import MIB, Workload, Workloads, process_infos, utilization


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
        self._work = Workloads(proc_root, clock)
        self._gpus = [
            SimGpu(spec, sim_uuid("GPU", f"{node_id}/{profile.id}/{spec.index}"))
            for spec in profile.gpus
        ]
        self._initialised = 0
        self._generation = 0
        self._down_seen = False
        self._recovery: dict[int, int] = {}  # physical GPU -> pending recovery action
        self._xids = XidDelivery(self._gpus, self._recovery)
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
            raise nvml_error(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
        if self._initialised <= 0:
            raise nvml_error(pynvml.NVML_ERROR_UNINITIALIZED)
        return faults

    def _gpu(self, handle: Any) -> SimGpu:
        faults = self._ready()
        gpu = handle.gpu if isinstance(handle, SimMig) else handle
        if not isinstance(gpu, SimGpu):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if faults.has("lost", gpu.spec.index):
            self._recovery.pop(gpu.spec.index, None)  # it comes back reset, or not at all
            raise nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
        return gpu

    def _visible(self, faults: Faults) -> list[SimGpu]:
        return [g for g in self._gpus if not faults.has("absent", g.spec.index)]

    def _whole(self, handle: Any) -> SimGpu:
        if isinstance(handle, SimMig):
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self._gpu(handle)

    # -- system -----------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.calls += 1
        if self.faults().has("nvml_down"):
            self._down_seen = True
            raise nvml_error(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
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
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = visible[index]
        for fault in faults.on("handle_error", gpu.spec.index):
            code = getattr(pynvml, f"NVML_ERROR_{fault.error.upper()}", pynvml.NVML_ERROR_UNKNOWN)
            raise nvml_error(int(code))
        return gpu

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        gpu = self._whole(handle)
        return self._visible(self.faults()).index(gpu)

    # -- identity ---------------------------------------------------------------------------

    def nvmlDeviceGetName(self, handle: Any) -> str:
        gpu = self._gpu(handle)
        if isinstance(handle, SimMig):
            return f"{gpu.spec.name} MIG {handle.profile}"
        return gpu.spec.name

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        gpu = self._gpu(handle)
        return handle.uuid if isinstance(handle, SimMig) else gpu.uuid

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        gpu = self._gpu(handle)
        if isinstance(handle, SimMig):
            mib = MIG_MEMORY_MIB.get(handle.profile, 0)
        else:
            mib = gpu.spec.memory_mib
        total = mib * MIB
        used = min(total, sum(w.memory_mib for w, _ in self._running(handle)) * MIB)
        return pynvml.c_nvmlMemory_t(total=total, free=total - used, used=used)

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        gpu = self._whole(handle)
        info = pynvml.nvmlPciInfo_t()
        info.busId = nvml_bus_id(gpu.spec.pci_bus_id)
        return info

    def nvmlDeviceGetNumaNodeId(self, handle: Any) -> int:
        return self._whole(handle).spec.numa_node

    def nvmlDeviceGetCpuAffinity(self, handle: Any, cpuSetSize: int) -> Any:
        numa = self._whole(handle).spec.numa_node
        words = [0] * cpuSetSize
        for cpu in self.profile.socket_cpus(numa):
            if cpu // 64 < cpuSetSize:
                words[cpu // 64] |= 1 << (cpu % 64)
        return words

    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]:
        return self._gpu(handle).spec.compute_capability

    # -- MIG --------------------------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        gpu = self._whole(device)
        if gpu.spec.compute_capability not in MIG_CAPABLE:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        mode = 1 if gpu.spec.mig_profiles else 0
        pending = 1 - mode if self.faults().has("mig_pending", gpu.spec.index) else mode
        return [mode, pending]

    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> int:
        gpu = self._whole(device)
        return MAX_MIG_DEVICES if gpu.spec.compute_capability in MIG_CAPABLE else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> Any:
        gpu = self._whole(device)
        if not 0 <= index < len(gpu.spec.mig_profiles):
            raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
        profile = gpu.spec.mig_profiles[index]
        return SimMig(gpu, index, profile, sim_uuid("MIG", f"{gpu.uuid}/{index}"))

    def nvmlDeviceGetGpuInstanceId(self, device: Any) -> int:
        self._gpu(device)
        if not isinstance(device, SimMig):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return device.slot + 1

    def nvmlDeviceGetComputeInstanceId(self, device: Any) -> int:
        self._gpu(device)
        if not isinstance(device, SimMig):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return 0

    # -- use: processes and utilization (agent.sim.workload) -------------------------------

    def _running(self, handle: Any) -> list[tuple[Workload, int]]:
        gpu = self._gpu(handle)
        work = [(f.key, f.workload) for f in self.faults().on("process") if f.workload]
        slot = handle.slot if isinstance(handle, SimMig) else None
        return self._work.running(work, gpu.spec, slot)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        """pynvml's v3 call: friendly objects of `c_nvmlProcessInfo_v3_t`'s fields."""
        gpu = self._gpu(handle)
        return process_infos(self._running(handle), mig=bool(gpu.spec.mig_profiles))

    def nvmlDeviceGetMPSComputeRunningProcesses(self, handle: Any) -> list[Any]:
        """The MPS clients (entries with `"mps": true`), in the compute call's shape."""
        gpu = self._gpu(handle)
        return process_infos(self._running(handle), mig=bool(gpu.spec.mig_profiles), mps=True)

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        """Not supported on MIG devices, nor on a GPU in MIG mode, as with the driver."""
        if isinstance(handle, SimMig) or self._gpu(handle).spec.mig_profiles:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return utilization(self._running(handle))

    def nvmlDeviceGetProcessUtilization(self, handle: Any, timeStamp: int) -> list[Any]:
        """A sample per busy process, newer than `timeStamp` (µs); NotFound when none."""
        if isinstance(handle, SimMig) or self._gpu(handle).spec.mig_profiles:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        found = self._work.samples(self._running(handle), timeStamp)
        if not found:
            raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
        return found

    # -- NVLink and fabric ------------------------------------------------------------------

    def nvmlDeviceGetNvLinkState(self, device: Any, link: int) -> int:
        gpu = self._whole(device)
        if gpu.spec.nvlink_links == 0:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= link < gpu.spec.nvlink_links:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
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
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if self.profile.nvswitch_pci:
            return int(pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH)
        return int(pynvml.NVML_NVLINK_DEVICE_TYPE_GPU)

    def nvmlDeviceGetNvLinkRemotePciInfo(self, device: Any, link: int) -> Any:
        if not self.nvmlDeviceGetNvLinkState(device, link):
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        switches = self.profile.nvswitch_pci
        info = pynvml.nvmlPciInfo_t()
        info.busId = nvml_bus_id(switches[link % len(switches)])
        return info

    def nvmlDeviceGetGpuFabricInfo(self, device: Any, gpuFabricInfo: Any) -> int:
        """Hopper and later GPUs on an NVSwitch board report the Fabric Manager's state
        (completed/success once FM has run; no cluster UUID: not a multi-node fabric)."""
        fill_fabric(struct_of(gpuFabricInfo), self._whole(device), self.profile, self.faults())
        return 0

    def nvmlDeviceGetGpuFabricInfoV(self, device: Any, gpuFabricInfo: Any) -> int:
        """The versioned call: a `c_nvmlGpuFabricInfo_v2_t` (adds healthMask) or `_v3_t`
        (adds healthSummary), told apart by its `version` field, like the driver."""
        info = struct_of(gpuFabricInfo)
        if getattr(info, "version", None) not in FABRIC_VERSIONS:
            raise nvml_error(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        fill_fabric(info, self._whole(device), self.profile, self.faults())
        return 0

    # -- InfoROM, ECC mode, temperatures ----------------------------------------------------

    def nvmlDeviceValidateInforom(self, handle: Any) -> None:
        gpu = self._whole(handle)
        if self.faults().has("inforom", gpu.spec.index):
            raise nvml_error(pynvml.NVML_ERROR_CORRUPTED_INFOROM)

    def nvmlDeviceGetEccMode(self, handle: Any) -> list[int]:
        gpu = self._whole(handle)
        pending = 0 if self.faults().has("ecc_pending", gpu.spec.index) else 1
        return [1, pending]

    def _celsius(self, gpu: SimGpu, sensor: str) -> int:
        found = [f.celsius for f in self.faults().on("temp", gpu.spec.index) if f.sensor == sensor]
        return max(found, default=IDLE_C)

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        gpu = self._whole(handle)
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._celsius(gpu, "gpu")

    def nvmlDeviceGetTemperatureThreshold(self, handle: Any, threshold: int) -> int:
        gpu = self._whole(handle)
        if threshold == pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX:
            if gpu.spec.compute_capability not in HBM:
                raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
            return HBM_MAX_C
        if threshold not in THRESHOLDS:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return THRESHOLDS[threshold]

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

    def _has_remapping(self, gpu: SimGpu) -> bool:
        return gpu.spec.compute_capability >= (8, 0)

    def nvmlDeviceGetRetiredPages(self, device: Any, sourceFilter: int) -> list[int]:
        gpu = self._whole(device)
        if self._has_remapping(gpu):
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
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
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return int(self.faults().has("retired_pending", gpu.spec.index))

    def nvmlDeviceGetRemappedRows(self, device: Any) -> tuple[int, int, int, int]:
        gpu = self._whole(device)
        if not self._has_remapping(gpu):
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
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

    def _pcie(self, gpu: SimGpu, attr: str) -> int | None:
        for fault in self.faults().on("pcie", gpu.spec.index):
            value = getattr(fault, attr)
            if value is not None:
                return int(value)
        return None

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any) -> int:
        return MAX_PCIE_GEN.get(self._whole(handle).spec.compute_capability, 4)

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
        if gpu.spec.compute_capability in HBM:
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
        return SimEventSet(self._generation)

    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None:
        gpu = self._whole(handle)
        if not isinstance(eventSet, SimEventSet) or eventSet.generation != self._generation:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if eventTypes & pynvml.nvmlEventTypeXidCriticalError:
            self._xids.register(eventSet, gpu.spec.index)

    def nvmlEventSetWait(self, eventSet: Any, timeoutms: int) -> Any:
        if not isinstance(eventSet, SimEventSet):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        deadline = time.monotonic() + timeoutms / 1000
        while True:
            faults = self._ready()
            # An event set made in an older NVML session is dead, like the driver's.
            live = eventSet.generation == self._generation
            event = self._xids.next(faults, eventSet) if live else None
            if event is not None:
                return event
            left = deadline - time.monotonic()
            if left <= 0:
                raise nvml_error(pynvml.NVML_ERROR_TIMEOUT)
            # Without a fault file no event can come: sleep the whole wait, like the driver.
            time.sleep(min(left, 0.1) if self._faults.watching else left)

    def nvmlEventSetFree(self, eventSet: Any) -> None:
        if isinstance(eventSet, SimEventSet):
            self._xids.free(eventSet)
