"""Turns NVML calls into readings: every call guarded, nothing raised past this module.

A call that fails with `NVMLError_NotSupported` (or any other NVML error) yields `None`
for that value and one log line naming what is missing and why; the same problem is not
logged again on every poll. A GPU whose handle or UUID cannot be read — lost
(`NVML_ERROR_GPU_IS_LOST`), `NVML_ERROR_UNKNOWN` (nvidia-smi's "Unable to determine the
device handle"), `NoPermission`, `FunctionNotFound` or anything else — is never dropped:
its last good reading is kept (or, before its first good read, a placeholder stands in
for it) with `missing` set, and its counters say `unreadable`, so health holds it
unhealthy. A GPU seen earlier that NVML no longer enumerates at all is kept the same way.
NVLink, NVSwitch and fabric state are read by `agent.links`.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import msgspec
import pynvml

from agent.errors import AgentError
from agent.links import LinkReader
from agent.nvml import NvmlLike
from agent.nvml_errors import GpuLost, describe, field_int, raise_if_lost
from agent.readings import GpuCounters, GpuReading, MigReading, NvmlSnapshot
from shared.ids import normalize_pci

T = TypeVar("T")
log = logging.getLogger(__name__)

_MIG_PROFILE = re.compile(r"(\d+g\.\d+gb(?:\+[a-z0-9.]+)?)", re.IGNORECASE)


_ENABLED = int(pynvml.NVML_FEATURE_ENABLED)
# Read in one nvmlDeviceGetFieldValues call; the first three apply to every GPU.
_FIELDS: tuple[tuple[str, int], ...] = (
    ("pcie_replay", pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER),
    ("recovery_action", pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION),
    ("memory_temp", pynvml.NVML_FI_DEV_MEMORY_TEMP),
    ("crc_flit", pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL),
    ("crc_data", pynvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL),
    ("replay", pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL),
    ("recovery", pynvml.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL),
)


class _Unreadable(AgentError):
    pass


LOST = "GPU is lost (NVML_ERROR_GPU_IS_LOST)"


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

    def __init__(
        self,
        nvml: NvmlLike,
        cpu_count: int | None = None,
        nvlinks: dict[str, int] | None = None,
        nvswitches: dict[str, int] | None = None,
        inforom_every: int = 60,
    ) -> None:
        """`nvlinks` adds or overrides `SXM_NVLINKS` (model name → links every GPU of that
        model must have active), `nvswitches` `HGX_NVSWITCHES` (model name → NVSwitches
        each GPU of that model reaches); `inforom_every`: InfoROM validated every this
        many reads of a GPU."""
        self._nvml = nvml
        self._links = LinkReader(nvml, nvlinks, nvswitches)
        self._started = False
        self._cpu_words = max(1, ((cpu_count or os.cpu_count() or 1) + 63) // 64)
        self._logged: set[str] = set()
        self._last_good: dict[int, GpuReading] = {}  # by index, this session only
        self._seen: dict[str, GpuReading] = {}  # by UUID, every GPU ever read
        self._generation = 0
        self._thresholds: dict[str, tuple[int | None, int | None]] = {}
        self._inforom_every = max(1, inforom_every)
        # By UUID: (reads since the last validation, its result, NVML session).
        self._inforom: dict[str, tuple[int, bool | None, int]] = {}

    @property
    def nvml(self) -> NvmlLike:
        return self._nvml

    @property
    def generation(self) -> int:
        """Counts NVML sessions; an event set made in an older one is dead."""
        return self._generation

    @property
    def started(self) -> bool:
        return self._started

    def start(self) -> str | None:
        """Initialise NVML; the reason it failed, or None."""
        if self._started:
            return None
        try:
            self._nvml.nvmlInit()
        except Exception as exc:  # any failure here means unmonitored, never a crash
            return f"nvml init failed: {describe(exc)}"
        self._started = True
        self._generation += 1
        self._last_good.clear()  # indices may have moved (a GPU fell off, the driver reloaded)
        return None

    def close(self) -> None:
        if not self._started:
            return
        self._started = False
        try:
            self._nvml.nvmlShutdown()
        except Exception as exc:
            log.debug("nvmlShutdown failed: %s", describe(exc))

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
            # Shut it down first so nvmlInit's reference count does not keep /dev/nvidia*
            # open after an operator asks the agent to let go of the devices.
            self.close()
            return NvmlSnapshot(
                driver_version=driver,
                error="nvml cannot count devices",
                problems=tuple(problems),
                generation=self._generation,
            )
        gpus: list[GpuReading] = []
        counters: list[GpuCounters] = []
        lost: list[int] = []
        unread: list[tuple[int, str]] = []
        for index in range(count):
            try:
                gpu, ctr = self._read_gpu(index, problems)
            except GpuLost:
                lost.append(index)
                unread.append((index, LOST))
                continue
            except _Unreadable as exc:
                unread.append((index, str(exc)))
                continue
            self._last_good[index] = gpu
            self._seen[gpu.uuid] = gpu
            gpus.append(gpu)
            counters.append(ctr)
        read = {g.uuid for g in gpus}
        for index, why in unread:
            problems.append(f"gpu {index}: {why}")
            last = self._last_good.get(index)
            if last is None or last.uuid in read:
                last = GpuReading(
                    index=index,
                    uuid=f"missing-nvml-{index}",
                    name="unknown",
                    memory_mib=0,
                    pci_bus_id="",
                )
            read.add(last.uuid)
            gpus.append(msgspec.structs.replace(last, missing=why))
            counters.append(
                GpuCounters(index=index, uuid=last.uuid, lost=why == LOST, unreadable=why)
            )
        for uuid, last in self._seen.items():
            if uuid not in read:
                why = "no longer enumerated by NVML"
                problems.append(f"gpu {last.index} ({uuid}): {why}")
                gpus.append(msgspec.structs.replace(last, missing=why))
                counters.append(GpuCounters(index=last.index, uuid=uuid, unreadable=why))
        for problem in problems:
            self._note(problem)
        return NvmlSnapshot(
            driver_version=driver,
            cuda_version=None if cuda is None else cuda_version_text(cuda),
            gpus=tuple(sorted(gpus, key=lambda g: g.index)),
            counters=tuple(sorted(counters, key=lambda c: c.index)),
            lost=tuple(lost),
            problems=tuple(problems),
            generation=self._generation,
        )

    # -- one GPU ------------------------------------------------------------------------

    def _read_gpu(self, index: int, problems: list[str]) -> tuple[GpuReading, GpuCounters]:
        """One GPU; raises GpuLost or _Unreadable when NVML cannot identify it."""
        n = self._nvml
        where = f"gpu {index}"
        handle = self._must(n.nvmlDeviceGetHandleByIndex, "handle", index)
        uuid = self._must(n.nvmlDeviceGetUUID, "uuid", handle)
        if not uuid:
            raise _Unreadable("uuid: empty")
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
        mig_enabled, migs, mig_pending = self._read_migs(handle, where, problems)
        active, remotes, down = self._links.nvlinks(uuid, name, handle)
        switches, gone = self._links.nvswitches(uuid, name, active)
        clique, fabric, fabric_health = self._links.fabric(handle)
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
            fabric_clique=clique,
        )
        ctr = self._read_counters(index, uuid, handle)
        return gpu, msgspec.structs.replace(
            ctr,
            fabric=fabric,
            fabric_health=fabric_health,
            mig_pending=mig_pending,
            nvlink_down=down,
            nvswitches=switches,
            nvswitches_missing=gone,
        )

    def _must(self, fn: Callable[..., T], what: str, *args: Any) -> T:
        try:
            return fn(*args)
        except pynvml.NVMLError as exc:
            raise_if_lost(exc)
            raise _Unreadable(f"{what}: {describe(exc)}") from exc
        except Exception as exc:  # a broken binding is a device we cannot see, not a crash
            raise _Unreadable(f"{what}: {describe(exc)}") from exc

    def _read_migs(
        self, handle: Any, where: str, problems: list[str]
    ) -> tuple[bool, tuple[MigReading, ...], bool]:
        """(enabled, instances, a mode change is pending until the GPU is reset)."""
        n = self._nvml
        mode = self._get(problems, f"{where}: mig mode", n.nvmlDeviceGetMigMode, handle, quiet=True)
        pending = mode is not None and len(mode) > 1 and int(mode[0]) != int(mode[1])
        if not mode or int(mode[0]) != pynvml.NVML_DEVICE_MIG_ENABLE:
            return False, (), pending
        slots = self._get(problems, f"{where}: mig count", n.nvmlDeviceGetMaxMigDeviceCount, handle)
        migs: list[MigReading] = []
        for slot in range(slots or 0):
            try:
                mh = n.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except pynvml.NVMLError as exc:
                raise_if_lost(exc)
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
        return True, tuple(migs), pending

    def _read_counters(self, index: int, uuid: str, handle: Any) -> GpuCounters:
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
        sbe_pages = self._get(
            p,
            "retired sbe",
            n.nvmlDeviceGetRetiredPages,
            handle,
            pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
            quiet=True,
        )
        rows = self._get(p, "remap", n.nvmlDeviceGetRemappedRows, handle, quiet=True)
        ecc = self._get(p, "ecc mode", n.nvmlDeviceGetEccMode, handle, quiet=True)
        celsius = self._get(
            p,
            "temperature",
            n.nvmlDeviceGetTemperature,
            handle,
            pynvml.NVML_TEMPERATURE_GPU,
            quiet=True,
        )
        slowdown, mem_max = self._temperature_limits(uuid, handle)
        reasons = self._get(
            p, "throttle", n.nvmlDeviceGetCurrentClocksThrottleReasons, handle, quiet=True
        )
        bits = int(reasons or 0)
        gen = self._pair(
            p, n.nvmlDeviceGetCurrPcieLinkGeneration, n.nvmlDeviceGetMaxPcieLinkGeneration, handle
        )
        width = self._pair(
            p, n.nvmlDeviceGetCurrPcieLinkWidth, n.nvmlDeviceGetMaxPcieLinkWidth, handle
        )
        fields = self._fields(handle, self._links.has_nvlink(uuid))
        hbm = fields.get("memory_temp")
        thermal = pynvml.nvmlClocksThrottleReasonHwThermalSlowdown
        thermal |= pynvml.nvmlClocksThrottleReasonSwThermalSlowdown
        power = pynvml.nvmlClocksThrottleReasonHwPowerBrakeSlowdown
        return GpuCounters(
            index=index,
            uuid=uuid,
            dbe_volatile=None if dbe is None else int(dbe),
            retired_pages=None if pages is None else len(pages) + len(sbe_pages or []),
            retired_pending=None if pending is None else int(pending) == _ENABLED,
            remap_pending=None if rows is None else bool(rows[2]),
            remap_failure=None if rows is None else bool(rows[3]),
            thermal_slowdown=bool(bits & thermal),
            power_slowdown=bool(bits & power),
            idle=bool(bits & pynvml.nvmlClocksThrottleReasonGpuIdle),
            pcie_gen=gen,
            pcie_width=width,
            pcie_replays=fields.get("pcie_replay"),
            nvlink_errors=tuple(
                (name, fields[name])
                for name in ("crc_flit", "crc_data", "replay", "recovery")
                if name in fields
            ),
            recovery_action=fields.get("recovery_action"),
            inforom_corrupt=self._inforom_corrupt(uuid, handle),
            ecc_mode=None if ecc is None else (int(ecc[0]), int(ecc[1])),
            temperature=None if celsius is None or slowdown is None else (int(celsius), slowdown),
            hbm_temperature=None if hbm is None or mem_max is None else (hbm, mem_max),
            hw_slowdown=bool(bits & pynvml.nvmlClocksThrottleReasonHwSlowdown),
        )

    def _inforom_corrupt(self, uuid: str, handle: Any) -> bool | None:
        """Validating reads and checksums the whole InfoROM, so it runs once every
        `inforom_every` reads of a GPU (and on the first read of each NVML session)."""
        reads, last, generation = self._inforom.get(uuid, (0, None, -1))
        if generation == self._generation and reads % self._inforom_every:
            self._inforom[uuid] = (reads + 1, last, generation)
            return last
        try:
            self._nvml.nvmlDeviceValidateInforom(handle)
            found: bool | None = False
        except pynvml.NVMLError as exc:
            raise_if_lost(exc)
            found = True if exc.value == pynvml.NVML_ERROR_CORRUPTED_INFOROM else None
        except Exception:
            found = None
        self._inforom[uuid] = (1, found, self._generation)
        return found

    def _temperature_limits(self, uuid: str, handle: Any) -> tuple[int | None, int | None]:
        """(GPU slowdown threshold, memory maximum), read once per GPU: they are fixed."""
        limits = self._thresholds.get(uuid)
        if limits is None:
            p: list[str] = []
            get = self._nvml.nvmlDeviceGetTemperatureThreshold
            slow = self._get(
                p, "t", get, handle, pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN, quiet=True
            )
            mem = self._get(
                p, "t", get, handle, pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX, quiet=True
            )
            limits = self._thresholds[uuid] = (
                None if not slow else int(slow),
                None if not mem else int(mem),
            )
        return limits

    def _pair(
        self, p: list[str], cur: Callable[[Any], int], top: Callable[[Any], int], handle: Any
    ) -> tuple[int, int] | None:
        a = self._get(p, "pcie", cur, handle, quiet=True)
        b = self._get(p, "pcie", top, handle, quiet=True)
        return None if a is None or b is None else (int(a), int(b))

    def _fields(self, handle: Any, nvlink: bool) -> dict[str, int]:
        """One nvmlDeviceGetFieldValues call for the counters that have no getter of their
        own (or would need one call per link): values that fail are left out."""
        wanted = dict(_FIELDS if nvlink else _FIELDS[:3])
        try:
            values = self._nvml.nvmlDeviceGetFieldValues(handle, list(wanted.values()))
        except pynvml.NVMLError as exc:
            raise_if_lost(exc)
            return {}
        except Exception:
            return {}
        out: dict[str, int] = {}
        for name, value in zip(wanted, values, strict=False):
            if int(value.nvmlReturn) == 0:
                out[name] = field_int(value)
        return out

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
            raise_if_lost(exc)
            if not quiet:
                problems.append(f"{what}: {describe(exc)}")
        except Exception as exc:  # a broken binding must not take the agent down
            problems.append(f"{what}: {describe(exc)}")
        return None

    def _note(self, problem: str) -> None:
        if problem not in self._logged:
            self._logged.add(problem)
            log.warning("nvml: %s", problem)
