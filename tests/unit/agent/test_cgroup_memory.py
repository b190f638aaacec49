"""Owners' host memory (issue 35), read from a fake /proc and cgroup tree as on a host:
one entry per owner from the cgroup its name came from, nothing counted twice, peaks
since the last read, bounded entries, and the changes a heartbeat carries."""

from __future__ import annotations

import grp
import os
from pathlib import Path

import pytest

from agent.cgroup_memory import CgroupMemory, cgroup_dir, owner_cgroup
from agent.sim.workload import FakeProcs, WorkloadError, parse_workload
from agent.use_changes import MEMORY_STEP_MIB, UseChanges
from shared.wire import MAX_OWNER_MEMORY, DeviceUse, Heartbeat, OwnerKind, OwnerMemory, ProcessUse
from tests.unit.agent.test_use_changes import HB

MIB = 1024 * 1024
POD = "0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b"
POD_SLICE = (
    f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD.replace('-', '_')}.slice"
)
CTR = "a" * 64
JOB_V2 = "/system.slice/slurmstepd.scope/job_42"
SESSION = "/user.slice/user-1000.slice/session-3.scope"


class Tree:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.ticks = 100

    def proc(self, pid: int, cgroup: str, env: dict[str, str] | None = None, gid: int = 0) -> None:
        base = self.root / "proc" / str(pid)
        base.mkdir(parents=True, exist_ok=True)
        self.ticks += 1
        fields = ["S"] + ["0"] * 18 + [str(self.ticks)]
        (base / "stat").write_text(f"{pid} (python) {' '.join(fields)}\n")
        (base / "cgroup").write_text(cgroup)
        (base / "environ").write_bytes(
            b"".join(f"{k}={v}\0".encode() for k, v in (env or {}).items())
        )
        (base / "status").write_text(f"Name:\tpython\nGid:\t{gid}\t{gid}\t{gid}\t{gid}\n")

    def memory(self, path: str, mib: int, peak_mib: int | None = None, v1: bool = False) -> None:
        base = self.root / "sys/fs/cgroup" / ("memory" if v1 else "") / path.strip("/")
        base.mkdir(parents=True, exist_ok=True)
        (base / ("memory.usage_in_bytes" if v1 else "memory.current")).write_text(f"{mib * MIB}\n")
        if peak_mib is not None:
            (base / "memory.peak").write_text(f"{peak_mib * MIB}\n")


def use(*procs: tuple[int, OwnerKind, str] | tuple[int, OwnerKind, str, str]) -> tuple[DeviceUse]:
    return (
        DeviceUse(
            device_id="GPU-1",
            processes=tuple(
                ProcessUse(
                    pid=p[0], owner_kind=p[1], owner=p[2], owner_name=(p[3] if len(p) > 3 else "")
                )  # type: ignore[misc]
                for p in procs
            ),
        ),
    )


def by_owner(entries: tuple[OwnerMemory, ...]) -> dict[tuple[str, str], tuple[int, int]]:
    return {(e.owner_kind, e.owner): (e.current_mib, e.peak_mib) for e in entries}


def test_the_owner_cgroup_is_the_one_that_names_it() -> None:
    assert owner_cgroup(f"{POD_SLICE}/cri-containerd-{CTR}.scope") == POD_SLICE
    assert owner_cgroup(f"{JOB_V2}/step_0/user/task_0") == JOB_V2
    assert owner_cgroup("/slurm/uid_1000/job_7/step_0") == "/slurm/uid_1000/job_7"
    assert owner_cgroup(SESSION) == SESSION  # no owner named: the process's own
    assert cgroup_dir("0::/x\n") == ("/x", True)
    # A hybrid host (as this project's own CI box): memory is v1's, the v2 line empty.
    hybrid = "9:name=systemd:/\n4:memory:/process_api/14bf\n1:cpu:/\n0::/\n"
    assert cgroup_dir(hybrid) == ("/process_api/14bf", False)
    assert cgroup_dir("12:memory,cpu:/slurm/job_7\n3:pids:/y\n") == ("/slurm/job_7", False)
    assert cgroup_dir("garbage") is None


def test_each_owner_gets_its_cgroup_once_with_what_rules_match(tmp_path: Path) -> None:
    tree = Tree(tmp_path)
    gid = os.getgid()
    tree.proc(10, f"0::{POD_SLICE}/cri-containerd-{CTR}.scope\n")
    tree.proc(11, f"0::{POD_SLICE}/cri-containerd-{'b' * 64}.scope\n")  # same pod
    tree.proc(20, f"0::{JOB_V2}/step_0\n", {"SLURM_JOB_ACCOUNT": "physics"}, gid=gid)
    tree.memory(POD_SLICE, 3000)
    tree.memory(JOB_V2, 5000, peak_mib=9000)
    entries = CgroupMemory(tmp_path).read(
        use((10, "pod", POD, "ml/trainer-0"), (11, "pod", POD, "ml/trainer-0"), (20, "slurm", "42"))
    )
    assert by_owner(entries) == {("pod", POD): (3000, 3000), ("slurm", "42"): (5000, 5000)}
    pod, job = sorted(entries, key=lambda e: e.owner_kind)
    assert pod.k8s_namespace == "ml"
    assert (job.slurm_account, job.unix_group) == ("physics", grp.getgrgid(gid).gr_name)
    assert OwnerMemory.from_json(job.to_json()) == job


def test_a_shared_cgroup_is_nobodys_and_an_inner_one_is_taken_out(tmp_path: Path) -> None:
    """Two reservations in one session scope: neither gets it (no tenant pays for the
    other's); a reservation's container inside a unit's cgroup is taken out of the unit."""
    tree = Tree(tmp_path)
    tree.proc(1, f"0::{SESSION}\n")
    tree.proc(2, f"0::{SESSION}\n")
    tree.proc(3, "0::/system.slice/train.service\n")
    tree.proc(4, f"0::/system.slice/train.service/docker-{CTR}.scope\n")
    tree.memory(SESSION, 1000)
    tree.memory("/system.slice/train.service", 4000)
    tree.memory(f"/system.slice/train.service/docker-{CTR}.scope", 1500)
    entries = CgroupMemory(tmp_path).read(
        use((1, "reservation", "rsv_a"), (2, "reservation", "rsv_b"),
            (3, "systemd", "train.service"), (4, "reservation", "rsv_c"))
    )  # fmt: skip
    assert by_owner(entries) == {
        ("unknown", ""): (1000, 1000),
        ("systemd", "train.service"): (2500, 2500),
        ("reservation", "rsv_c"): (1500, 1500),
    }
    assert sum(e.current_mib for e in entries) == 4000 + 1000  # the host's, once


def test_the_peak_is_since_the_last_read(tmp_path: Path) -> None:
    tree = Tree(tmp_path)
    tree.proc(20, f"0::{JOB_V2}\n")
    reader = CgroupMemory(tmp_path)
    tree.memory(JOB_V2, 2000, peak_mib=9000)  # a peak from before we looked: not ours
    assert by_owner(reader.read(use((20, "slurm", "42")))) == {("slurm", "42"): (2000, 2000)}
    tree.memory(JOB_V2, 2500, peak_mib=12000)  # rose in between
    assert by_owner(reader.read(use((20, "slurm", "42")))) == {("slurm", "42"): (2500, 12000)}
    tree.memory(JOB_V2, 2400, peak_mib=12000)
    assert by_owner(reader.read(use((20, "slurm", "42")))) == {("slurm", "42"): (2400, 2400)}


def test_v1_unreadable_and_root_cgroups(tmp_path: Path) -> None:
    tree = Tree(tmp_path)
    tree.proc(1, "4:memory:/slurm/uid_1000/job_7/step_0\n1:name=systemd:/x\n")
    tree.memory("/slurm/uid_1000/job_7", 700, v1=True)
    tree.proc(2, "0::/\n")  # the root: the host's, no one's
    tree.proc(3, "0::/system.slice/gone.service\n")  # no memory files: nothing known
    entries = CgroupMemory(tmp_path).read(
        use(
            (1, "slurm", "7"),
            (2, "unknown", ""),
            (3, "systemd", "gone.service"),
            (9, "unknown", ""),
        )
    )
    assert by_owner(entries) == {("slurm", "7"): (700, 700)}


def test_entries_are_bounded_and_the_rest_kept_as_unknown(tmp_path: Path) -> None:
    tree = Tree(tmp_path)
    n = MAX_OWNER_MEMORY + 10
    for i in range(n):
        tree.proc(100 + i, f"0::/system.slice/s{i}.service\n")
        tree.memory(f"/system.slice/s{i}.service", 1 + i)
    entries = CgroupMemory(tmp_path).read(
        use(*((100 + i, "systemd", f"s{i}.service") for i in range(n)))
    )
    assert len(entries) == MAX_OWNER_MEMORY
    assert sum(e.current_mib for e in entries) == sum(1 + i for i in range(n))
    assert by_owner(entries)[("unknown", "")][0] == sum(1 + i for i in range(11))  # smallest


def test_memory_rides_the_heartbeat_as_changes_and_gone_owners_as_zero() -> None:
    changes = UseChanges()
    job = OwnerMemory(owner_kind="slurm", owner="42", current_mib=4000, peak_mib=4000)
    assert changes.observe((), 0.0, (job,))
    plan = changes.plan(HB)
    assert plan.report is None and plan.heartbeat.memory == (job,)
    assert len(plan.heartbeat.to_json()) < 1024
    assert plan.inline is not None
    changes.sent(plan.inline)
    small = OwnerMemory(owner_kind="slurm", owner="42", current_mib=4000 + MEMORY_STEP_MIB - 1)
    assert not changes.observe((), 1.0, (small,))  # noise: settled
    assert changes.plan(HB).heartbeat.memory == ()
    assert changes.observe((), 2.0, ())
    gone = changes.plan(HB).heartbeat
    assert gone.memory == (OwnerMemory(owner_kind="slurm", owner="42"),)
    assert Heartbeat.from_json(gone.to_json()) == gone


def test_too_many_owners_go_in_a_full_report() -> None:
    changes = UseChanges()
    many = tuple(
        OwnerMemory(
            owner_kind="pod", owner=f"{i:08d}-0000-0000-0000-000000000000", current_mib=i + 1
        )
        for i in range(40)
    )
    changes.observe((), 0.0, many)
    plan = changes.plan(HB)
    assert plan.report is not None and plan.report.memory == many
    assert plan.heartbeat.memory == () and len(plan.heartbeat.to_json()) < 1024


def test_simulated_workloads_write_their_memory_curves_into_the_cgroup_tree(
    tmp_path: Path,
) -> None:
    """Two workloads of one pod: the pod's slice holds both, as the kernel would sum it."""
    wave = {"shape": "ramp", "from": 1000, "to": 2000, "period_s": 10}
    a = parse_workload(
        {"pid": 1, "gpu": 0, "cgroup": f"0::{POD_SLICE}/crio-{CTR}.scope", "host_memory_mib": wave},
        "faults[0]",
    )
    b = parse_workload(
        {
            "pid": 2,
            "gpu": 0,
            "cgroup": f"0::{POD_SLICE}/crio-{'b' * 64}.scope",
            "host_memory_mib": 500,
        },
        "faults[1]",
    )
    procs = FakeProcs(tmp_path / "proc")
    procs.sync((a, b))
    procs.memory([(a, 5.0), (b, 5.0)])
    entries = CgroupMemory(tmp_path).read(use((1, "pod", POD), (2, "pod", POD)))
    assert by_owner(entries) == {("pod", POD): (2000, 2000)}
    procs.memory([(a, 0.0), (b, 0.0)])  # down again: the peak file keeps the most
    slice_dir = tmp_path / "sys/fs/cgroup" / POD_SLICE.strip("/")
    assert (slice_dir / "memory.peak").read_text().strip() == str(2000 * MIB)
    assert (slice_dir / "memory.current").read_text().strip() == str(1500 * MIB)
    with pytest.raises(WorkloadError, match=r"faults\[2\]\.host_memory_mib"):
        parse_workload({"pid": 3, "gpu": 0, "host_memory_mib": -5}, "faults[2]")
