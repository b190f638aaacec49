"""Reads use from NVML: per GPU and MIG instance, utilization, memory used and the
compute processes with their owners. Every call guarded; nothing raised past here.

Calls (pynvml's names and shapes): `nvmlDeviceGetUtilizationRates` (`.gpu`, `.memory`
in percent), `nvmlDeviceGetMemoryInfo` (`.used`, bytes),
`nvmlDeviceGetComputeRunningProcesses` (the v3 call: objects with `pid`,
`usedGpuMemory` in bytes or None, `gpuInstanceId`, `computeInstanceId`) and
`nvmlDeviceGetMPSComputeRunningProcesses` (the same, for MPS clients: the compute call
lists only the MPS daemon; merged by pid, and empty where the call is missing or not
supported) and
`nvmlDeviceGetProcessUtilization(handle, lastSeenTimeStamp)` (`c_nvmlProcessUtilizationSample_t`:
`pid`, `timeStamp` in µs, `smUtil`, `memUtil`, `encUtil`, `decUtil`), the same on each MIG
device handle (`nvmlDeviceGetMigDeviceHandleByIndex`). A value NVML cannot give
(`NotSupported`, as utilization is on MIG instances, or any error) is None; a process
sample list that is `NotFound` means no process ran since the last read (0 %). A GPU
NVML cannot read (lost, missing, NVML down or released) is reported with every value
None and no processes: nothing is known of its use.

On a MIG-enabled GPU the processes are listed under their MIG instance (the GPU's own
entry carries only its memory used), so no process is counted twice.

A unit's list holds at most `MAX_PROCESSES`; beyond that the processes of its own
holders (`holders`: unit → the reservation ids booked on it, from the node's bookings)
are left out first, then the smallest in memory, and `processes_omitted` says how many:
a process of another reservation or of no reservation is what the coordinator's alerts
need.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import pynvml

from agent.errors import AgentError
from agent.nvml import NvmlLike
from agent.owners import UNKNOWN, ProcOwners
from agent.readings import GpuReading
from shared.wire import MAX_PROCESSES, DeviceUse, ProcessUse

T = TypeVar("T")
log = logging.getLogger(__name__)

MIB = 1024 * 1024
_NOT_SUPPORTED = int(pynvml.NVML_ERROR_NOT_SUPPORTED)
_NOT_FOUND = int(pynvml.NVML_ERROR_NOT_FOUND)


class _Failed(AgentError):
    """One NVML call failed: its value is unknown."""


class UsageReader:
    """Reads the use of a host's GPUs through an `NvmlLike` whose session the
    `NvmlReader` has started. Not thread-safe: one read at a time (the poll thread)."""

    def __init__(
        self,
        nvml: NvmlLike,
        owners: ProcOwners | None = None,
        holders: Callable[[], Mapping[str, frozenset[str]]] | None = None,
    ) -> None:
        self._nvml = nvml
        self._owners = owners
        self._holders = holders
        self._seen_pids: set[int] = set()  # every process read this pass, listed or not
        self._seen_us: dict[str, int] = {}  # by device UUID: newest process sample read
        self._logged: set[str] = set()

    def read(self, gpus: Sequence[GpuReading], readable: bool = True) -> tuple[DeviceUse, ...]:
        """The use of each GPU in `gpus` (an `NvmlSnapshot`'s, placeholders included) and
        of its MIG instances; `readable=False` (NVML down or released) calls nothing."""
        out: list[DeviceUse] = []
        self._seen_pids = set()
        held = self._holders() if self._holders is not None and readable else {}
        for gpu in gpus:
            if readable and gpu.missing is None:
                out.extend(self._gpu(gpu, held))
            else:
                out.extend(_unknown(gpu))
        if self._owners is not None:
            self._owners.keep_only(self._seen_pids)
        return tuple(out)

    def _gpu(self, gpu: GpuReading, held: Mapping[str, frozenset[str]]) -> list[DeviceUse]:
        n = self._nvml
        try:
            handle = self._call(f"gpu {gpu.index}: handle", n.nvmlDeviceGetHandleByIndex, gpu.index)
            if self._call(f"gpu {gpu.index}: uuid", n.nvmlDeviceGetUUID, handle) != gpu.uuid:
                raise _Failed  # indices moved since the reading: read it next poll
        except _Failed:
            return _unknown(gpu)
        if not gpu.mig_enabled:
            return [self._device(gpu.uuid, handle, held.get(gpu.uuid, frozenset()))]
        whole = self._device(gpu.uuid, handle, None)
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
                out.append(self._device(uuid, mh, held.get(uuid, frozenset())))
        out.extend(DeviceUse(device_id=uuid) for uuid in sorted(migs))
        return out

    def _device(self, uuid: str, handle: Any, holders: frozenset[str] | None) -> DeviceUse:
        """The unit's use; `holders` None: its memory only (a GPU in MIG mode)."""
        n = self._nvml
        util = self._get(f"{uuid}: utilization", n.nvmlDeviceGetUtilizationRates, handle)
        mem = self._get(f"{uuid}: memory", n.nvmlDeviceGetMemoryInfo, handle)
        used = _attr_int(mem, "used")
        if holders is None:
            return DeviceUse(device_id=uuid, memory_used_mib=None if used is None else used // MIB)
        found = self._processes(uuid, handle)
        self._seen_pids.update(p.pid for p in found)
        kept = sorted(found, key=lambda p: _leave_out_first(p, holders))[:MAX_PROCESSES]
        return DeviceUse(
            device_id=uuid,
            sm_util=_percent(_attr_int(util, "gpu")),
            memory_util=_percent(_attr_int(util, "memory")),
            memory_used_mib=None if used is None else used // MIB,
            processes=tuple(sorted(kept, key=lambda p: p.pid)),
            processes_omitted=len(found) - len(kept),
        )

    def _processes(self, uuid: str, handle: Any) -> list[ProcessUse]:
        """The compute processes and MPS clients on the unit, one per pid, owned."""
        n = self._nvml
        infos = list(
            self._get(f"{uuid}: processes", n.nvmlDeviceGetComputeRunningProcesses, handle) or ()
        )
        # Missing from an old binding (AttributeError) or NotSupported: no MPS clients.
        mps = getattr(n, "nvmlDeviceGetMPSComputeRunningProcesses", None)
        if mps is not None:
            infos += self._get(f"{uuid}: mps processes", mps, handle) or ()
        by_pid: dict[int, Any] = {}
        for info in infos:
            by_pid.setdefault(int(info.pid), info)
        if not by_pid:
            return []
        samples = self._samples(uuid, handle)
        found: list[ProcessUse] = []
        for pid, info in by_pid.items():
            owner = self._owners.owner(pid) if self._owners is not None else UNKNOWN
            memory = _attr_int(info, "usedGpuMemory")
            found.append(
                ProcessUse(
                    pid=pid,
                    used_memory_mib=None if memory is None else memory // MIB,
                    owner=owner.id,
                    owner_kind=owner.kind,
                    owner_name=owner.name,
                    sm_util=None if samples is None else samples.get(pid, 0),
                )
            )
        return found

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


def _leave_out_first(p: ProcessUse, holders: frozenset[str]) -> tuple[bool, int, int]:
    """Sort key: kept first, a process not of the unit's holders, then the largest."""
    own = p.owner_kind == "reservation" and p.owner in holders
    return (own, -(p.used_memory_mib or 0), p.pid)


def _unknown(gpu: GpuReading) -> list[DeviceUse]:
    return [DeviceUse(device_id=d) for d in (gpu.uuid, *(m.uuid for m in gpu.migs))]


def _attr_int(obj: Any, name: str) -> int | None:
    value = getattr(obj, name, None)
    return None if value is None else int(value)


def _percent(value: int | None) -> int | None:
    return None if value is None else max(0, min(100, value))
