"""Turns NVML calls into readings: every call guarded, nothing raised past this module.

A call that fails with `NVMLError_NotSupported` (or any other NVML error) yields `None`
for that value and one log line naming what is missing and why; the same problem is not
logged again on every poll. `NVML_ERROR_GPU_IS_LOST` is different: it marks the GPU lost
for health, and the GPU's last good reading is kept so that its atoms do not vanish from
the inventory while it is broken.

NVLink topology is remembered as the union of links ever seen active, so a link going
down shows as a health problem (`nvlink_down`) rather than as a smaller inventory.
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import pynvml

from agent.nvml import NvmlLike
from agent.readings import GpuCounters, GpuReading, MigReading, NvmlSnapshot

T = TypeVar("T")
log = logging.getLogger(__name__)

_MIG_PROFILE = re.compile(r"(\d+g\.\d+gb(?:\+[a-z0-9.]+)?)", re.IGNORECASE)


_ENABLED = int(pynvml.NVML_FEATURE_ENABLED)


class _GpuLost(Exception):
    pass


def normalize_pci(bus_id: str) -> str:
    """NVML writes `00000000:18:00.0`, sysfs `0000:18:00.0`; compare them in one form."""
    text = bus_id.strip().lower()
    parts = text.split(":")
    if len(parts) == 3:
        try:
            return f"{int(parts[0], 16):04x}:{parts[1]}:{parts[2]}"
        except ValueError:
            return text
    return text


def cpu_list(words: Iterable[int]) -> str:
    """64-bit affinity words → `0-27,56-83` (the kernel's cpulist format)."""
    cpus = [w * 64 + b for w, word in enumerate(words) for b in range(64) if int(word) >> b & 1]
    ranges: list[str] = []
    start = prev = -2
    for cpu in [*cpus, -2]:
        if cpu == prev + 1:
            prev = cpu
            continue
        if start >= 0:
            ranges.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = cpu
    return ",".join(ranges)


def cuda_version_text(raw: int) -> str:
    return f"{raw // 1000}.{raw % 1000 // 10}"


class NvmlReader:
    """Reads one host through an `NvmlLike`. Not thread-safe: one poll at a time."""

    def __init__(self, nvml: NvmlLike, cpu_count: int | None = None) -> None:
        self._nvml = nvml
        self._started = False
        self._cpu_words = max(1, ((cpu_count or os.cpu_count() or 1) + 63) // 64)
        self._logged: set[str] = set()
        self._last_good: dict[int, GpuReading] = {}
        self._links: dict[str, tuple[int, ...]] = {}
        self._ever_active: dict[str, set[int]] = {}
        self._remotes: dict[str, dict[int, str]] = {}

    @property
    def nvml(self) -> NvmlLike:
        return self._nvml

    def start(self) -> str | None:
        """Initialise NVML; the reason it failed, or None."""
        if self._started:
            return None
        try:
            self._nvml.nvmlInit()
        except Exception as exc:  # any failure here means unmonitored, never a crash
            return f"nvml init failed: {_describe(exc)}"
        self._started = True
        return None

    def close(self) -> None:
        if not self._started:
            return
        self._started = False
        try:
            self._nvml.nvmlShutdown()
        except Exception as exc:
            log.debug("nvmlShutdown failed: %s", _describe(exc))

    def read(self) -> NvmlSnapshot:
        error = self.start()
        if error is not None:
            self._note(error)
            return NvmlSnapshot(error=error, problems=(error,))
        problems: list[str] = []
        driver = self._get(problems, "driver version", self._nvml.nvmlSystemGetDriverVersion)
        cuda = self._get(problems, "cuda version", self._nvml.nvmlSystemGetCudaDriverVersion)
        count = self._get(problems, "device count", self._nvml.nvmlDeviceGetCount)
        if count is None:
            # Initialise again next poll: after a driver reload the old session is dead.
            self._started = False
            return NvmlSnapshot(
                driver_version=driver,
                error="nvml cannot count devices",
                problems=tuple(problems),
            )
        gpus: list[GpuReading] = []
        counters: list[GpuCounters] = []
        lost: list[int] = []
        for index in range(count):
            try:
                gpu, ctr = self._read_gpu(index, problems)
            except _GpuLost:
                lost.append(index)
                problems.append(f"gpu {index}: GPU is lost")
                last = self._last_good.get(index)
                if last is not None:
                    gpus.append(last)
                    counters.append(GpuCounters(index=index, uuid=last.uuid, lost=True))
                continue
            if gpu is None or ctr is None:
                continue
            self._last_good[index] = gpu
            gpus.append(gpu)
            counters.append(ctr)
        for problem in problems:
            self._note(problem)
        return NvmlSnapshot(
            driver_version=driver,
            cuda_version=None if cuda is None else cuda_version_text(cuda),
            gpus=tuple(gpus),
            counters=tuple(counters),
            lost=tuple(lost),
            problems=tuple(problems),
        )

    # -- one GPU ------------------------------------------------------------------------

    def _read_gpu(
        self, index: int, problems: list[str]
    ) -> tuple[GpuReading | None, GpuCounters | None]:
        n = self._nvml
        where = f"gpu {index}"
        handle = self._get(problems, f"{where}: handle", n.nvmlDeviceGetHandleByIndex, index)
        if handle is None:
            return None, None
        uuid = self._get(problems, f"{where}: uuid", n.nvmlDeviceGetUUID, handle)
        if not uuid:
            return None, None
        name = self._get(problems, f"{where}: name", n.nvmlDeviceGetName, handle) or "unknown"
        mem = self._get(problems, f"{where}: memory", n.nvmlDeviceGetMemoryInfo, handle)
        pci = self._get(problems, f"{where}: pci info", n.nvmlDeviceGetPciInfo, handle)
        numa = self._get(problems, f"{where}: numa node", n.nvmlDeviceGetNumaNodeId, handle)
        words = self._get(
            problems, f"{where}: cpu affinity", n.nvmlDeviceGetCpuAffinity, handle, self._cpu_words
        )
        cc = self._get(
            problems, f"{where}: compute capability", n.nvmlDeviceGetCudaComputeCapability, handle
        )
        mig_enabled, migs = self._read_migs(handle, where, problems)
        active, remotes = self._read_nvlinks(uuid, handle)
        gpu = GpuReading(
            index=index,
            uuid=uuid,
            name=name,
            memory_mib=0 if mem is None else int(mem.total) // (1024 * 1024),
            pci_bus_id="" if pci is None else normalize_pci(pci.busId),
            numa_node=None if numa is None or numa < 0 else int(numa),
            cpu_affinity=None if words is None else (cpu_list(list(words)) or None),
            compute_capability=None if cc is None else f"{cc[0]}.{cc[1]}",
            mig_enabled=mig_enabled,
            migs=migs,
            nvlink_remotes=remotes,
            nvlink_active=active,
            fabric_clique=self._read_fabric(handle),
        )
        return gpu, self._read_counters(index, uuid, handle, active)

    def _read_migs(
        self, handle: Any, where: str, problems: list[str]
    ) -> tuple[bool, tuple[MigReading, ...]]:
        n = self._nvml
        mode = self._get(problems, f"{where}: mig mode", n.nvmlDeviceGetMigMode, handle, quiet=True)
        if not mode or int(mode[0]) != pynvml.NVML_DEVICE_MIG_ENABLE:
            return False, ()
        slots = self._get(problems, f"{where}: mig count", n.nvmlDeviceGetMaxMigDeviceCount, handle)
        migs: list[MigReading] = []
        for slot in range(slots or 0):
            try:
                mh = n.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except pynvml.NVMLError as exc:
                _raise_if_lost(exc)
                continue  # empty slots answer NotFound: expected, not a problem
            at = f"{where} mig {slot}"
            uuid = self._get(problems, f"{at}: uuid", n.nvmlDeviceGetUUID, mh)
            if not uuid:
                continue
            name = self._get(problems, f"{at}: name", n.nvmlDeviceGetName, mh) or ""
            mem = self._get(problems, f"{at}: memory", n.nvmlDeviceGetMemoryInfo, mh)
            gi = self._get(problems, f"{at}: gpu instance", n.nvmlDeviceGetGpuInstanceId, mh)
            ci = self._get(problems, f"{at}: compute inst", n.nvmlDeviceGetComputeInstanceId, mh)
            found = _MIG_PROFILE.search(name)
            migs.append(
                MigReading(
                    uuid=uuid,
                    gpu_instance_id=-1 if gi is None else int(gi),
                    compute_instance_id=-1 if ci is None else int(ci),
                    profile=found.group(1).lower() if found else "unknown",
                    memory_mib=0 if mem is None else int(mem.total) // (1024 * 1024),
                )
            )
        return True, tuple(migs)

    def _read_nvlinks(self, uuid: str, handle: Any) -> tuple[tuple[int, ...], tuple[str, ...]]:
        n = self._nvml
        links = self._links.get(uuid)
        if links is None:
            # Links are numbered from 0; the first link that is not supported ends the list.
            found: list[int] = []
            for link in range(int(pynvml.NVML_NVLINK_MAX_LINKS)):
                try:
                    n.nvmlDeviceGetNvLinkState(handle, link)
                except pynvml.NVMLError as exc:
                    _raise_if_lost(exc)
                    break
                found.append(link)
            links = self._links[uuid] = tuple(found)
        active: list[int] = []
        for link in links:
            try:
                if int(n.nvmlDeviceGetNvLinkState(handle, link)) == 1:
                    active.append(link)
            except pynvml.NVMLError as exc:
                _raise_if_lost(exc)
        ever = self._ever_active.setdefault(uuid, set())
        remotes = self._remotes.setdefault(uuid, {})
        for link in active:
            if link not in remotes:
                try:
                    pci = n.nvmlDeviceGetNvLinkRemotePciInfo(handle, link)
                    remotes[link] = normalize_pci(pci.busId)
                except pynvml.NVMLError as exc:
                    _raise_if_lost(exc)
        ever.update(active)
        return tuple(active), tuple(sorted(set(remotes.values())))

    def _read_fabric(self, handle: Any) -> str | None:
        info = pynvml.c_nvmlGpuFabricInfo_t()
        try:
            self._nvml.nvmlDeviceGetGpuFabricInfo(handle, ctypes.byref(info))
        except pynvml.NVMLError as exc:
            _raise_if_lost(exc)
            return None  # only NVLink-fabric systems (GH200/GB200 NVL) answer this
        if int(info.state) != pynvml.NVML_GPU_FABRIC_STATE_COMPLETED or int(info.status) != 0:
            return None
        cluster = bytes(info.clusterUuid)
        if not any(cluster):
            return None
        return f"{cluster.hex()}/{int(info.cliqueId)}"

    def _read_counters(
        self, index: int, uuid: str, handle: Any, active: tuple[int, ...]
    ) -> GpuCounters:
        n = self._nvml
        p: list[str] = []  # unsupported counters are normal; they are not operator problems
        dbe = self._get(
            p,
            "dbe",
            n.nvmlDeviceGetTotalEccErrors,
            handle,
            pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            pynvml.NVML_VOLATILE_ECC,
            quiet=True,
        )
        pages = self._get(
            p,
            "retired",
            n.nvmlDeviceGetRetiredPages,
            handle,
            pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
            quiet=True,
        )
        pending = self._get(
            p, "pending", n.nvmlDeviceGetRetiredPagesPendingStatus, handle, quiet=True
        )
        rows = self._get(p, "remap", n.nvmlDeviceGetRemappedRows, handle, quiet=True)
        reasons = self._get(
            p, "throttle", n.nvmlDeviceGetCurrentClocksThrottleReasons, handle, quiet=True
        )
        bits = int(reasons or 0)
        thermal = pynvml.nvmlClocksThrottleReasonHwThermalSlowdown
        thermal |= pynvml.nvmlClocksThrottleReasonSwThermalSlowdown
        power = pynvml.nvmlClocksThrottleReasonHwPowerBrakeSlowdown
        down = sorted(self._ever_active.get(uuid, set()) - set(active))
        return GpuCounters(
            index=index,
            uuid=uuid,
            dbe_volatile=None if dbe is None else int(dbe),
            retired_pages=None if pages is None else len(pages),
            retired_pending=None if pending is None else int(pending) == _ENABLED,
            remap_pending=None if rows is None else bool(rows[2]),
            remap_failure=None if rows is None else bool(rows[3]),
            thermal_slowdown=bool(bits & thermal),
            power_slowdown=bool(bits & power),
            nvlink_down=tuple(down),
        )

    # -- guarding -------------------------------------------------------------------------

    def _get(
        self,
        problems: list[str],
        what: str,
        fn: Callable[..., T],
        *args: Any,
        quiet: bool = False,
    ) -> T | None:
        try:
            return fn(*args)
        except pynvml.NVMLError as exc:
            _raise_if_lost(exc)
            if not quiet:
                problems.append(f"{what}: {_describe(exc)}")
        except Exception as exc:  # a broken binding must not take the agent down
            problems.append(f"{what}: {_describe(exc)}")
        return None

    def _note(self, problem: str) -> None:
        if problem not in self._logged:
            self._logged.add(problem)
            log.warning("nvml: %s", problem)


def _raise_if_lost(exc: BaseException) -> None:
    if getattr(exc, "value", None) == pynvml.NVML_ERROR_GPU_IS_LOST:
        raise _GpuLost from exc


def _describe(exc: BaseException) -> str:
    if isinstance(exc, pynvml.NVMLError):
        return f"{type(exc).__name__} ({exc})"
    return f"{type(exc).__name__}: {exc}"
