"""Reading use through the simulated NVML: utilization, memory, processes and owners per
GPU and MIG instance, every failure degrading to None; the simulator's workloads follow
pynvml's own signatures and struct shapes."""

from __future__ import annotations

import ctypes
import inspect
from pathlib import Path
from typing import Any

import pynvml
import pytest

from agent.nvml import NvmlLike
from agent.owners import ProcOwners
from agent.reader import NvmlReader
from agent.sim.faults import FaultError, FaultFile, parse_faults, write_faults
from agent.sim.nvml import SimulatedNvml
from agent.sim.profile import load_profile
from agent.sim.workload import Curve
from agent.usage import UsageReader
from shared.clock import FakeClock
from shared.wire import MAX_PROCESSES, DeviceUse

RSV = "rsv_01jabcdefghjkmnpqrstvwxyz0"
POD = "1234abcd-5678-90ab-cdef-1234567890ab"
KUBE = (
    f"0::/kubepods.slice/kubepods-pod{POD.replace('-', '_')}.slice/cri-containerd-{'a' * 64}.scope"
)


class Host:
    """A simulated host whose workloads come from a fault file, read like the agent does."""

    def __init__(self, tmp: Path, profile: str, nvml_class: type[SimulatedNvml] = SimulatedNvml):
        self.clock = FakeClock()
        self.faults = tmp / "faults.json"
        self.proc = tmp / "proc"
        self.nvml = nvml_class(
            load_profile(profile),
            "n1",
            FaultFile(self.faults),
            self.proc,
            clock=lambda: self.clock.now_ms() / 1000,
        )
        self.reader = NvmlReader(self.nvml)
        self.usage = UsageReader(self.nvml, ProcOwners(self.proc))

    def run(self, *entries: dict[str, Any]) -> None:
        write_faults(self.faults, list(entries))

    def read(self) -> dict[str, DeviceUse]:
        snap = self.reader.read()
        return {d.device_id: d for d in self.usage.read(snap.gpus, snap.error is None)}

    def uuids(self) -> list[str]:
        return [g.uuid for g in self.reader.read().gpus]


def booked(pid: int, gpus: list[int], level: int = 80, **more: Any) -> dict[str, Any]:
    return {
        "kind": "process",
        "pid": pid,
        "gpus": gpus,
        "memory_mib": 20480,
        "env": {"GPUFLEET_RESERVATION_ID": RSV},
        "util": {"shape": "constant", "level": level},
        **more,
    }


def test_each_gpu_reports_utilization_memory_and_owned_processes(tmp_path: Path) -> None:
    host = Host(tmp_path, "h100-sxm-8")
    host.run(
        booked(4242, [0, 1]),
        {"kind": "process", "pid": 77, "gpu": 3, "memory_mib": 1000, "cgroup": KUBE},
    )
    uuids = host.uuids()
    use = host.read()
    assert list(use) == uuids  # every GPU, in index order
    for gpu in (0, 1):
        d = use[uuids[gpu]]
        assert (d.sm_util, d.memory_util, d.memory_used_mib) == (80, 40, 20480)
        (p,) = d.processes
        assert (p.pid, p.owner_kind, p.owner, p.used_memory_mib, p.sm_util) == (
            4242,
            "reservation",
            RSV,
            20480,
            80,
        )
    (pod,) = use[uuids[3]].processes
    assert (pod.owner_kind, pod.owner, pod.sm_util) == ("pod", POD, 0)  # idle: no samples
    idle = use[uuids[2]]
    assert (idle.sm_util, idle.memory_used_mib, idle.processes) == (0, 0, ())
    # The workload ends: its /proc entry goes, and so does the process.
    host.run()
    assert host.read()[uuids[0]].processes == ()
    assert not (host.proc / "4242").exists()


def test_mig_processes_are_listed_under_their_instance_only(tmp_path: Path) -> None:
    host = Host(tmp_path, "a100-mig-8")
    host.run(booked(500, [0], mig=2, memory_mib=4096), booked(501, [0]), booked(502, [2]))
    gpus = host.reader.read().gpus
    use = host.read()
    mig0 = gpus[0].migs
    assert [d for d in use if d in {m.uuid for m in mig0}] == [m.uuid for m in mig0]
    whole = use[gpus[0].uuid]
    # The GPU in MIG mode: memory of all its instances, no utilization, no processes.
    assert (whole.sm_util, whole.memory_used_mib, whole.processes) == (None, 24576, ())
    on_slot = {m.uuid: [p.pid for p in use[m.uuid].processes] for m in mig0}
    assert on_slot == {mig0[0].uuid: [501], mig0[1].uuid: [], mig0[2].uuid: [500], mig0[3].uuid: []}
    mig = use[mig0[2].uuid]
    assert mig.sm_util is None and mig.memory_used_mib == 4096  # MIG: no utilization
    assert mig.processes[0].sm_util is None and mig.processes[0].owner == RSV
    assert [p.pid for p in use[gpus[2].uuid].processes] == [502]


def test_a_lost_gpu_or_nvml_down_is_use_unknown_never_a_crash(tmp_path: Path) -> None:
    host = Host(tmp_path, "h100-sxm-8")
    uuids = host.uuids()
    host.run(booked(1, [0, 2]), {"kind": "lost", "gpu": 2})
    use = host.read()
    assert use[uuids[2]] == DeviceUse(device_id=uuids[2])
    assert use[uuids[0]].processes[0].pid == 1
    gpus = host.reader.read().gpus
    calls = host.nvml.calls
    unknown = host.usage.read(gpus, readable=False)  # NVML down or released: no calls
    assert host.nvml.calls == calls
    assert unknown == tuple(DeviceUse(device_id=g.uuid) for g in gpus)


class Unsupported(SimulatedNvml):
    """A GPU generation (or driver) without the use calls."""

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetProcessUtilization(self, handle: Any, timeStamp: int) -> list[Any]:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        if self.nvmlDeviceGetIndex(handle) == 1:
            raise RuntimeError("a broken binding")
        return super().nvmlDeviceGetComputeRunningProcesses(handle)

    def nvmlDeviceGetMPSComputeRunningProcesses(self, handle: Any) -> list[Any]:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)


class WithoutMps(SimulatedNvml):
    """An nvidia-ml-py too old to have the MPS call."""

    @property
    def nvmlDeviceGetMPSComputeRunningProcesses(self) -> Any:
        raise AttributeError("nvmlDeviceGetMPSComputeRunningProcesses")


def test_unsupported_calls_degrade_to_none(tmp_path: Path) -> None:
    host = Host(tmp_path, "l40s-pcie-4", Unsupported)
    host.run(booked(9, [0, 1]))
    uuids = host.uuids()
    use = host.read()
    first = use[uuids[0]]
    assert (first.sm_util, first.memory_util, first.memory_used_mib) == (None, None, 20480)
    assert first.processes[0].sm_util is None and first.processes[0].owner == RSV
    assert use[uuids[1]].processes == ()


def test_a_full_list_keeps_other_owners_first_and_says_how_many_it_left_out(
    tmp_path: Path,
) -> None:
    """Found: lists were cut at 256 per device without a word, and the 301st process, of
    another reservation (30 GiB at 90 %), was dropped."""
    host = Host(tmp_path, "h100-sxm-8")
    uuids = host.uuids()
    other = "rsv_01jzzzzzzzzzzzzzzzzzzzzzzz"
    own = [booked(1000 + i, [0], level=0, memory_mib=100) for i in range(300)]
    intruder = booked(5000, [0], level=90, memory_mib=30720, env={"GPUFLEET_RESERVATION_ID": other})
    pod = {"kind": "process", "pid": 5001, "gpu": 0, "memory_mib": 10, "cgroup": KUBE}
    host.run(*own, intruder, pod)
    host.usage = UsageReader(
        host.nvml, ProcOwners(host.proc), holders=lambda: {uuids[0]: frozenset({RSV})}
    )
    d = host.read()[uuids[0]]
    assert len(d.processes) == MAX_PROCESSES and d.processes_omitted == 302 - MAX_PROCESSES
    by_pid = {p.pid: p for p in d.processes}
    assert by_pid[5000].owner == other and by_pid[5000].used_memory_mib == 30720
    assert by_pid[5000].sm_util == 90
    assert by_pid[5001].owner_kind == "pod"
    assert [p.pid for p in d.processes] == sorted(by_pid)
    assert host.read()[uuids[1]].processes_omitted == 0
    DeviceUse.from_json(d.to_json())  # within the wire's bounds


def test_mps_clients_are_read_and_attributed(tmp_path: Path) -> None:
    """Found: only the MPS daemon showed on an MPS-shared GPU."""
    host = Host(tmp_path, "h100-sxm-8")
    uuids = host.uuids()
    daemon = {
        "kind": "process",
        "pid": 900,
        "gpu": 0,
        "memory_mib": 30,
        "comm": "nvidia-cuda-mps-server",
    }
    host.run(daemon, booked(901, [0], level=40, mps=True), booked(902, [0, 1], level=20, mps=True))
    use = host.read()
    procs = {p.pid: p for p in use[uuids[0]].processes}
    assert sorted(procs) == [900, 901, 902]
    assert (procs[901].owner_kind, procs[901].owner, procs[901].sm_util) == ("reservation", RSV, 40)
    assert procs[902].used_memory_mib == 20480
    assert [p.pid for p in use[uuids[1]].processes] == [902]
    n = host.nvml
    h = n.nvmlDeviceGetHandleByIndex(0)
    assert [p.pid for p in n.nvmlDeviceGetComputeRunningProcesses(h)] == [900]
    assert [p.pid for p in n.nvmlDeviceGetMPSComputeRunningProcesses(h)] == [901, 902]


@pytest.mark.parametrize("nvml_class", [Unsupported, WithoutMps])
def test_without_the_mps_call_compute_processes_still_show(
    tmp_path: Path, nvml_class: type[SimulatedNvml]
) -> None:
    host = Host(tmp_path, "l40s-pcie-4", nvml_class)
    host.run(booked(9, [0]), booked(10, [0], mps=True))
    assert [p.pid for p in host.read()[host.uuids()[0]].processes] == [9]


def test_process_samples_are_read_once_each(tmp_path: Path) -> None:
    host = Host(tmp_path, "h100-sxm-8")
    host.run(
        booked(3, [0], level=0, util={"shape": "square", "low": 0, "high": 90, "period_s": 60})
    )
    uuid = host.uuids()[0]
    assert host.read()[uuid].processes[0].sm_util == 90
    # No time passed: no new sample since the last one read, so 0, not the old 90.
    assert host.read()[uuid].processes[0].sm_util == 0
    host.clock.advance(40_000)  # the low half of the square wave
    assert host.read()[uuid].sm_util == 0
    host.clock.advance(30_000)
    assert host.read()[uuid].processes[0].sm_util == 90


def test_curves() -> None:
    ramp = Curve(shape="ramp", start=10, end=90, period_s=100)
    assert [ramp.at(t) for t in (0, 50, 100, 500)] == [10, 50, 90, 90]
    square = Curve(shape="square", low=5, high=95, period_s=10, duty=0.3)
    assert [square.at(t) for t in (0, 2.9, 3, 9.9, 10)] == [95, 95, 5, 5, 95]
    assert Curve(level=250).at(0) == 100


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"kind": "process", "gpus": [0]}, r"faults\[0\]\.pid"),
        ({"kind": "process", "pid": 1}, r"faults\[0\]\.gpus"),
        ({"kind": "process", "pid": 1, "gpus": [0], "env": {"A": 1}}, r"\.env"),
        ({"kind": "process", "pid": 1, "gpus": [0], "util": {"shape": "sine"}}, r"\.util"),
        ({"kind": "process", "pid": 1, "gpus": [0], "util": {"level": -1}}, r"util\.level"),
        ({"kind": "process", "pid": 1, "gpus": [0], "memory_mib": "x"}, r"memory_mib"),
    ],
)
def test_bad_process_entries_name_the_field(entry: dict[str, Any], message: str) -> None:
    with pytest.raises(FaultError, match=message):
        parse_faults({"faults": [entry]})


def test_the_simulator_returns_pynvmls_own_structs(tmp_path: Path) -> None:
    host = Host(tmp_path, "h100-sxm-8")
    host.run(booked(4242, [0]))
    n = host.nvml
    n.nvmlInit()
    h = n.nvmlDeviceGetHandleByIndex(0)
    (info,) = n.nvmlDeviceGetComputeRunningProcesses(h)
    assert isinstance(info, pynvml.nvmlFriendlyObject)
    fields = [name for name, _ in pynvml.c_nvmlProcessInfo_v3_t._fields_]
    assert fields == ["pid", "usedGpuMemory", "gpuInstanceId", "computeInstanceId"]
    assert {name: getattr(info, name) for name in fields} == {
        "pid": 4242,
        "usedGpuMemory": 20480 * 1024 * 1024,
        "gpuInstanceId": 0xFFFFFFFF,
        "computeInstanceId": 0xFFFFFFFF,
    }
    util = n.nvmlDeviceGetUtilizationRates(h)
    assert isinstance(util, pynvml.c_nvmlUtilization_t) and (util.gpu, util.memory) == (80, 40)
    (sample,) = n.nvmlDeviceGetProcessUtilization(h, 0)
    assert isinstance(sample, pynvml.c_nvmlProcessUtilizationSample_t)
    assert [f for f, _ in sample._fields_] == [
        "pid",
        "timeStamp",
        "smUtil",
        "memUtil",
        "encUtil",
        "decUtil",
    ]
    with pytest.raises(pynvml.NVMLError_NotFound):  # nothing newer than the last sample
        n.nvmlDeviceGetProcessUtilization(h, sample.timeStamp)
    mem = n.nvmlDeviceGetMemoryInfo(h)
    assert isinstance(mem, pynvml.c_nvmlMemory_t) and mem.used + mem.free == mem.total
    assert ctypes.sizeof(sample) == ctypes.sizeof(pynvml.c_nvmlProcessUtilizationSample_t)


def _protocol_methods() -> list[str]:
    return [name for name in vars(NvmlLike) if name.startswith("nvml")]


@pytest.mark.parametrize("name", _protocol_methods())
def test_the_simulator_takes_pynvmls_arguments(name: str) -> None:
    """Every call the agent makes has pynvml's name and parameters, in the protocol and
    in the simulator, so code written against one runs on the other."""
    params = inspect.signature(inspect.unwrap(getattr(pynvml, name))).parameters.values()
    real = [p.name for p in params if p.default is inspect.Parameter.empty]  # the required
    sim = list(inspect.signature(getattr(SimulatedNvml, name)).parameters)[1:]
    proto = list(inspect.signature(getattr(NvmlLike, name)).parameters)[1:]
    assert sim == real and proto == real
