"""Reads use from NVML: per GPU and MIG instance, utilization, memory used and the
compute processes with their owners. Every call guarded; nothing raised past here.

Calls (pynvml's names and shapes): `nvmlDeviceGetUtilizationRates` (`.gpu`, `.memory`
in percent), `nvmlDeviceGetMemoryInfo` (`.used`, bytes),
`nvmlDeviceGetComputeRunningProcesses` (the v3 call: objects with `pid`,
`usedGpuMemory` in bytes or None, `gpuInstanceId`, `computeInstanceId`) and
`nvmlDeviceGetProcessUtilization(handle, lastSeenTimeStamp)` (`c_nvmlProcessUtilizationSample_t`:
`pid`, `timeStamp` in µs, `smUtil`, `memUtil`, `encUtil`, `decUtil`), the same on each MIG
device handle (`nvmlDeviceGetMigDeviceHandleByIndex`). A value NVML cannot give
(`NotSupported`, as utilization is on MIG instances, or any error) is None; a process
sample list that is `NotFound` means no process ran since the last read (0 %). A GPU
NVML cannot read (lost, missing, NVML down or released) is reported with every value
None and no processes: nothing is known of its use.

On a MIG-enabled GPU the processes are listed under their MIG instance (the GPU's own
entry carries only its memory used), so no process is counted twice.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import pynvml

from agent.errors import AgentError
from agent.nvml import NvmlLike
from agent.owners import UNKNOWN, ProcOwners
from agent.readings import GpuReading
from shared.wire import DeviceUse, ProcessUse

T = TypeVar("T")
log = logging.getLogger(__name__)

MIB = 1024 * 1024
MAX_PROCESSES = 256  # DeviceUse.processes' bound
_NOT_SUPPORTED = int(pynvml.NVML_ERROR_NOT_SUPPORTED)
_NOT_FOUND = int(pynvml.NVML_ERROR_NOT_FOUND)


class _Failed(AgentError):
    """One NVML call failed: its value is unknown."""


class UsageReader:
    """Reads the use of a host's GPUs through an `NvmlLike` whose session the
    `NvmlReader` has started. Not thread-safe: one read at a time (the poll thread)."""

    def __init__(self, nvml: NvmlLike, owners: ProcOwners | None = None) -> None:
        self._nvml = nvml
        self._owners = owners
        self._seen_us: dict[str, int] = {}  # by device UUID: newest process sample read
        self._logged: set[str] = set()

    def read(self, gpus: Sequence[GpuReading], readable: bool = True) -> tuple[DeviceUse, ...]:
        """The use of each GPU in `gpus` (an `NvmlSnapshot`'s, placeholders included) and
        of its MIG instances; `readable=False` (NVML down or released) calls nothing."""
        out: list[DeviceUse] = []
        for gpu in gpus:
            out.extend(self._gpu(gpu) if readable and gpu.missing is None else _unknown(gpu))
        if self._owners is not None:
            self._owners.keep_only(p.pid for d in out for p in d.processes)
        return tuple(out)

    def _gpu(self, gpu: GpuReading) -> list[DeviceUse]:
        n = self._nvml
        try:
            handle = self._call(f"gpu {gpu.index}: handle", n.nvmlDeviceGetHandleByIndex, gpu.index)
            if self._call(f"gpu {gpu.index}: uuid", n.nvmlDeviceGetUUID, handle) != gpu.uuid:
                raise _Failed  # indices moved since the reading: read it next poll
        except _Failed:
            return _unknown(gpu)
        if not gpu.mig_enabled:
            return [self._device(gpu.uuid, handle)]
        whole = self._device(gpu.uuid, handle, processes=False)
        out = [whole]
        migs = {m.uuid for m in gpu.migs}
        slots = self._get(f"gpu {gpu.index}: mig count", n.nvmlDeviceGetMaxMigDeviceCount, handle)
        for slot in range(slots or 0):
            try:
                mh = n.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
                uuid = n.nvmlDeviceGetUUID(mh)
            except Exception:  # an empty slot answers NotFound: expected
                continue
            if uuid in migs:
                migs.discard(uuid)
                out.append(self._device(uuid, mh))
        out.extend(DeviceUse(device_id=uuid) for uuid in sorted(migs))
        return out

    def _device(self, uuid: str, handle: Any, processes: bool = True) -> DeviceUse:
        n = self._nvml
        util = self._get(f"{uuid}: utilization", n.nvmlDeviceGetUtilizationRates, handle)
        mem = self._get(f"{uuid}: memory", n.nvmlDeviceGetMemoryInfo, handle)
        used = _attr_int(mem, "used")
        if not processes:
            return DeviceUse(device_id=uuid, memory_used_mib=None if used is None else used // MIB)
        procs = self._get(f"{uuid}: processes", n.nvmlDeviceGetComputeRunningProcesses, handle)
        found: list[ProcessUse] = []
        if procs:
            samples = self._samples(uuid, handle)
            for proc in list(procs)[:MAX_PROCESSES]:
                pid = int(proc.pid)
                owner = self._owners.owner(pid) if self._owners is not None else UNKNOWN
                memory = _attr_int(proc, "usedGpuMemory")
                found.append(
                    ProcessUse(
                        pid=pid,
                        used_memory_mib=None if memory is None else memory // MIB,
                        owner=owner.id,
                        owner_kind=owner.kind,
                        sm_util=None if samples is None else samples.get(pid, 0),
                    )
                )
        return DeviceUse(
            device_id=uuid,
            sm_util=_percent(_attr_int(util, "gpu")),
            memory_util=_percent(_attr_int(util, "memory")),
            memory_used_mib=None if used is None else used // MIB,
            processes=tuple(sorted(found, key=lambda p: p.pid)),
        )

    def _samples(self, uuid: str, handle: Any) -> dict[int, int] | None:
        """Each process's highest SM utilization since the last read (pid → percent); {}
        when none ran (`NotFound`), None when NVML cannot say."""
        since = self._seen_us.get(uuid, 0)
        try:
            samples = self._nvml.nvmlDeviceGetProcessUtilization(handle, since)
        except pynvml.NVMLError as exc:
            if exc.value == _NOT_FOUND:
                return {}
            self._note(f"{uuid}: process utilization", exc)
            return None
        except Exception as exc:
            self._note(f"{uuid}: process utilization", exc)
            return None
        out: dict[int, int] = {}
        for sample in samples:
            pid, sm = int(sample.pid), _percent(int(sample.smUtil))
            out[pid] = max(out.get(pid, 0), sm or 0)
            since = max(since, int(sample.timeStamp))
        self._seen_us[uuid] = since
        return out

    def _call(self, what: str, fn: Callable[..., T], *args: Any) -> T:
        try:
            return fn(*args)
        except Exception as exc:
            self._note(what, exc)
            raise _Failed from exc

    def _get(self, what: str, fn: Callable[..., T], *args: Any) -> T | None:
        try:
            return self._call(what, fn, *args)
        except _Failed:
            return None

    def _note(self, what: str, exc: BaseException) -> None:
        """One debug line per kind of failure: a GPU generation lacking a counter is
        normal, and the inventory's reader reports a GPU that cannot be read."""
        if getattr(exc, "value", None) == _NOT_SUPPORTED:
            what = what.split(":", 1)[-1]  # the same for every GPU of the model
        key = f"{what}: {type(exc).__name__}"
        if key not in self._logged:
            self._logged.add(key)
            log.debug("use: %s (%s)", key, exc)


def _unknown(gpu: GpuReading) -> list[DeviceUse]:
    return [DeviceUse(device_id=d) for d in (gpu.uuid, *(m.uuid for m in gpu.migs))]


def _attr_int(obj: Any, name: str) -> int | None:
    value = getattr(obj, name, None)
    return None if value is None else int(value)


def _percent(value: int | None) -> int | None:
    return None if value is None else max(0, min(100, value))
