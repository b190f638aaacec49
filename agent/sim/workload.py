"""Simulated workloads: GPU processes with an environment, a cgroup and a utilization
curve, given as `process` entries of the fault file, and their fake `/proc` entries.

    {"kind": "process", "pid": 4242, "gpus": [0, 1], "memory_mib": 20480,
     "env": {"GPUFLEET_RESERVATION_ID": "rsv_…"},
     "cgroup": "0::/kubepods.slice/kubepods-pod…slice/cri-containerd-….scope",
     "util": {"shape": "square", "low": 0, "high": 90, "period_s": 60, "duty": 0.5}}

`gpus` (or `gpu`) are the profile's GPUs; `mig` puts the process on that MIG slot of
each (the profile's `[[mig]]` order). `util` shapes: `constant` (`level`), `ramp` (from
`from` to `to` over `period_s`, then held) and `square` (`high` for `duty` of each
`period_s`, else `low`); time runs from when the simulator first saw the entry.
`memory_mib` is the process's memory on each GPU; `host_memory_mib` its host memory, a
number or a curve of the same shapes in MiB (`{"shape": "ramp", "from": 1024, "to":
8192, "period_s": 600}`), written as cgroup v2 `memory.current` and `memory.peak` of its
cgroup and each one above it (`<root>/sys/fs/cgroup/…`, summed as the kernel does), so
the agent reads the owner's memory as on a host. The simulated NVML lists the process
(pynvml's v3 process info), reports its utilization, and writes `<proc>/<pid>/environ`,
`cgroup` and `stat` so the agent resolves its owner as on a host. `"mps": true` makes it
an MPS client: listed by `nvmlDeviceGetMPSComputeRunningProcesses`, not by the compute
call (which lists the MPS daemon, when an entry such as `"comm":
"nvidia-cuda-mps-server"` stands for it).
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import msgspec

from agent.errors import AgentError
from agent.sim.profile import GpuSpec

log = logging.getLogger(__name__)

SHAPES = ("constant", "ramp", "square")
MIB = 1024 * 1024
NO_INSTANCE = 0xFFFFFFFF  # gpuInstanceId/computeInstanceId of a process off MIG


class WorkloadError(AgentError, ValueError):
    pass


class Curve(msgspec.Struct, frozen=True):
    shape: str = "constant"
    level: float = 0.0  # constant
    start: float = 0.0  # ramp: `from`
    end: float = 0.0  # ramp: `to`
    low: float = 0.0
    high: float = 0.0
    period_s: float = 60.0
    duty: float = 0.5

    def at(self, t: float) -> int:
        """Utilization (0–100 %) `t` seconds into the workload."""
        return max(0, min(100, round(self.value(t))))

    def value(self, t: float) -> float:
        """The curve's value `t` seconds into the workload, unbounded (memory, MiB)."""
        if self.shape == "ramp":
            f = min(1.0, max(0.0, t / self.period_s)) if self.period_s > 0 else 1.0
            value = self.start + (self.end - self.start) * f
        elif self.shape == "square":
            phase = (t % self.period_s) / self.period_s if self.period_s > 0 else 0.0
            value = self.high if phase < self.duty else self.low
        else:
            value = self.level
        return value


# A login session's scope: where a process the fault file places nowhere runs.
DEFAULT_CGROUP = "0::/user.slice/user-1000.slice/session-1.scope"


class Workload(msgspec.Struct, frozen=True):
    pid: int
    gpus: tuple[int, ...]
    memory_mib: int = 0
    mig: int | None = None
    env: tuple[tuple[str, str], ...] = ()
    cgroup: str = DEFAULT_CGROUP
    comm: str = "python"
    util: Curve = Curve()
    mps: bool = False  # an MPS client: listed by the MPS call, not the compute one
    host_memory: Curve | None = None  # MiB of host memory its cgroup holds


def parse_workload(entry: dict[str, Any], where: str) -> Workload:
    pid = entry.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or not 0 < pid < 2**31:
        raise WorkloadError(f"{where}.pid: a positive integer")
    gpus = entry.get("gpus", [entry["gpu"]] if "gpu" in entry else None)
    if not isinstance(gpus, list) or not gpus or not all(_is_int(g) and g >= 0 for g in gpus):
        raise WorkloadError(f"{where}.gpus: a non-empty list of GPU numbers")
    env = entry.get("env", {})
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise WorkloadError(f"{where}.env: an object of strings")
    for key in ("cgroup", "comm"):
        if key in entry and not isinstance(entry[key], str):
            raise WorkloadError(f"{where}.{key}: a string")
    if not isinstance(entry.get("mps", False), bool):
        raise WorkloadError(f"{where}.mps: true or false")
    for key in ("memory_mib", "mig"):
        value = entry.get(key)
        if value is not None and not (_is_int(value) and value >= 0):
            raise WorkloadError(f"{where}.{key}: a non-negative integer")
    return Workload(
        pid=pid,
        gpus=tuple(gpus),
        memory_mib=int(entry.get("memory_mib") or 0),
        mig=entry.get("mig"),
        env=tuple(sorted(env.items())),
        cgroup=str(entry.get("cgroup", DEFAULT_CGROUP)),
        comm=str(entry.get("comm", "python")),
        util=_curve(entry.get("util", {"shape": "constant", "level": 0}), f"{where}.util"),
        mps=bool(entry.get("mps", False)),
        host_memory=_memory_curve(entry.get("host_memory_mib"), f"{where}.host_memory_mib"),
    )


def _memory_curve(data: Any, where: str) -> Curve | None:
    if data is None:
        return None
    if _is_int(data):
        if data < 0:
            raise WorkloadError(f"{where}: a non-negative number of MiB, or a curve")
        return Curve(level=float(data))
    return _curve(data, where)


def _curve(data: Any, where: str) -> Curve:
    if not isinstance(data, dict) or data.get("shape", "constant") not in SHAPES:
        raise WorkloadError(f"{where}: an object with a shape ({', '.join(SHAPES)})")
    names = {"level": "level", "from": "start", "to": "end", "low": "low", "high": "high"}
    names |= {"period_s": "period_s", "duty": "duty"}
    values: dict[str, float] = {}
    for key, attr in names.items():
        value = data.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise WorkloadError(f"{where}.{key}: a non-negative number")
        values[attr] = float(value)
    return Curve(shape=str(data.get("shape", "constant")), **values)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class Workloads:
    """The fault file's workloads as the simulated NVML sees them: which run on a GPU or
    MIG slot, at what utilization now (each curve timed from when its entry was first
    seen), with their fake /proc entries kept in step."""

    def __init__(self, proc_root: Path | None, clock: Callable[[], float]) -> None:
        self._procs = FakeProcs(proc_root) if proc_root is not None else None
        self._clock = clock
        self._started: dict[str, float] = {}  # entry key -> when first seen
        self._synced: tuple[Workload, ...] | None = None

    def running(
        self, entries: Iterable[tuple[str, Workload]], gpu: GpuSpec, slot: int | None
    ) -> list[tuple[Workload, int]]:
        """(workload, its utilization now) for each process on the profile's GPU `gpu`:
        on its MIG slot `slot`, or (None) anywhere on it."""
        entries = list(entries)
        now = self._clock()
        for key, _ in entries:
            self._started.setdefault(key, now)
        work = tuple(w for _, w in entries)
        if self._procs is not None and work != self._synced:
            self._procs.sync(work)
            self._synced = work
        if self._procs is not None:
            self._procs.memory([(w, now - self._started[k]) for k, w in entries])
        out: list[tuple[Workload, int]] = []
        for key, w in entries:
            if gpu.index not in w.gpus:
                continue
            if slot is not None and gpu.mig_profiles and (w.mig or 0) != slot:
                continue
            out.append((w, w.util.at(now - self._started[key])))
        return out

    def samples(self, running: list[tuple[Workload, int]], since_us: int) -> list[Any]:
        """`c_nvmlProcessUtilizationSample_t` of each busy process, newer than `since_us`."""
        import pynvml  # here, not at the top: see `process_infos`

        now_us = int(self._clock() * 1_000_000)
        return [
            pynvml.c_nvmlProcessUtilizationSample_t(
                pid=w.pid, timeStamp=now_us, smUtil=util, memUtil=util // 2
            )
            for w, util in running
            if util > 0 and now_us > since_us
        ]


def process_infos(running: list[tuple[Workload, int]], mig: bool, mps: bool = False) -> list[Any]:
    """What pynvml's v3 process calls return (the compute call's, or with `mps` the MPS
    clients' call's): friendly objects of the struct's fields."""
    # Imported only when the simulator runs: the agent's entry point reads fault files
    # (so this module) before it checks that nvidia-ml-py is installed, and a host
    # without it must get that message and exit 2, not a traceback.
    import pynvml

    out = []
    for w, _ in running:
        if w.mps != mps:
            continue
        gi, ci = ((w.mig or 0) + 1, 0) if mig else (NO_INSTANCE, NO_INSTANCE)
        info = pynvml.c_nvmlProcessInfo_v3_t(
            pid=w.pid, usedGpuMemory=w.memory_mib * MIB, gpuInstanceId=gi, computeInstanceId=ci
        )
        out.append(pynvml.nvmlStructToFriendlyObject(info))
    return out


def utilization(running: list[tuple[Workload, int]]) -> Any:
    """`c_nvmlUtilization_t` of a GPU running these: their sum, memory half of it."""
    import pynvml  # here, not at the top: see `process_infos`

    sm = min(100, sum(u for _, u in running))
    return pynvml.c_nvmlUtilization_t(gpu=sm, memory=sm // 2)


def _v2_path(cgroup: str) -> str:
    """The v2 line's path of a workload's `cgroup` text ("" when it has none)."""
    for line in cgroup.splitlines():
        if line.startswith("0::"):
            return line[3:].strip()
    return ""


class FakeProcs:
    """Keeps `<root>/<pid>/{environ,cgroup,stat,comm}` for the current workloads, and
    removes the entries it wrote for workloads that ended. Never writes under `/proc`."""

    def __init__(self, root: Path) -> None:
        if root.resolve() == Path("/proc"):
            raise WorkloadError("the fake /proc tree cannot be the host's /proc")
        self._root = root
        self._written: dict[int, Workload] = {}
        self._boot_ticks = 1000
        self._cgroups = root.parent / "sys" / "fs" / "cgroup"
        if self._cgroups.resolve() == Path("/sys/fs/cgroup"):
            raise WorkloadError("the fake cgroup tree cannot be the host's /sys/fs/cgroup")
        self._peaks: dict[str, int] = {}  # cgroup → the most written there, bytes

    def memory(self, running: Iterable[tuple[Workload, float]]) -> None:
        """Write each workload's host memory at its time into its cgroup and every one
        above it (the root excepted): `memory.current`, and `memory.peak` the most seen."""
        held: dict[str, int] = {}
        for work, t in running:
            if work.host_memory is None:
                continue
            mib = max(0, round(work.host_memory.value(t)))
            path = _v2_path(work.cgroup)
            parts = [p for p in path.split("/") if p]
            for i in range(1, len(parts) + 1):
                up = "/".join(parts[:i])
                held[up] = held.get(up, 0) + mib * MIB
        for path, value in held.items():
            peak = max(self._peaks.get(path, 0), value)
            self._peaks[path] = peak
            base = self._cgroups / path
            base.mkdir(parents=True, exist_ok=True)
            (base / "memory.current").write_text(f"{value}\n")
            (base / "memory.peak").write_text(f"{peak}\n")

    def sync(self, workloads: tuple[Workload, ...]) -> None:
        wanted = {w.pid: w for w in workloads}
        for pid in [p for p in self._written if wanted.get(p) != self._written[p]]:
            shutil.rmtree(self._root / str(pid), ignore_errors=True)
            del self._written[pid]
        for pid, work in wanted.items():
            if pid not in self._written:
                self._write(work)
                self._written[pid] = work

    def _write(self, work: Workload) -> None:
        base = self._root / str(work.pid)
        base.mkdir(parents=True, exist_ok=True)
        (base / "environ").write_bytes(b"".join(f"{k}={v}\0".encode() for k, v in work.env))
        (base / "cgroup").write_text(work.cgroup.rstrip("\n") + "\n")
        (base / "comm").write_text(work.comm + "\n")
        # A new start time for each (re)written process: to the reader, a new process.
        self._boot_ticks += 1
        fields = ["S", "1", str(work.pid), str(work.pid), "0", "-1", "4194560"]
        fields += ["0"] * 12 + [str(self._boot_ticks), "0", "0"]
        (base / "stat").write_text(f"{work.pid} ({work.comm}) {' '.join(fields)}\n")
