"""Owners of GPU processes from /proc: the reservation in the environment, else the
cgroup (pod, Slurm job, container, systemd unit), on real-looking v1 and v2 lines."""

from __future__ import annotations

import json
import os
import pwd
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.owners import (
    MAX_OWNER,
    UNKNOWN,
    Owner,
    ProcOwners,
    owner_from_cgroup,
    owner_from_environ,
)
from agent.sim.workload import FakeProcs, Workload

POD = "1234abcd-5678-90ab-cdef-1234567890ab"
CTR = "0123456789abcdef" * 4

# Copied from hosts (ids replaced): one process's /proc/<pid>/cgroup each.
V2_KUBE_SYSTEMD = (
    "0::/kubepods.slice/kubepods-burstable.slice/"
    f"kubepods-burstable-pod{POD.replace('-', '_')}.slice/cri-containerd-{CTR}.scope\n"
)
V2_KUBE_GUARANTEED = (
    f"0::/kubepods.slice/kubepods-pod{POD.replace('-', '_')}.slice/crio-{CTR}.scope"
)
V1_KUBE_CGROUPFS = "\n".join(
    [
        f"12:memory:/kubepods/besteffort/pod{POD}/{CTR}",
        f"11:devices:/kubepods/besteffort/pod{POD}/{CTR}",
        f"1:name=systemd:/kubepods/besteffort/pod{POD}/{CTR}",
        f"0::/kubepods/besteffort/pod{POD}/{CTR}",
    ]
)
V1_SLURM = "\n".join(
    [
        "13:freezer:/slurm/uid_1000/job_4242/step_0",
        "7:devices:/slurm/uid_1000/job_4242/step_0/task_0",
        "4:memory:/slurm/uid_1000/job_4242/step_0/task_0",
        "1:name=systemd:/system.slice/slurmd.service",
    ]
)
V2_SLURM = "0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0"
V2_DOCKER = f"0::/system.slice/docker-{CTR}.scope"
V1_DOCKER = f"11:devices:/docker/{CTR}\n1:name=systemd:/docker/{CTR}"
V2_PODMAN = f"0::/machine.slice/libpod-{CTR}.scope/container"
V2_UNIT = "0::/system.slice/trainer.service"
V2_USER_UNIT = "0::/user.slice/user-1000.slice/user@1000.service/app.slice/job-7.service"
V2_SESSION = "0::/user.slice/user-1000.slice/session-3.scope"


@pytest.mark.parametrize(
    ("text", "owner"),
    [
        (V2_KUBE_SYSTEMD, Owner("pod", POD)),
        (V2_KUBE_GUARANTEED, Owner("pod", POD)),
        (V1_KUBE_CGROUPFS, Owner("pod", POD)),
        (V1_SLURM, Owner("slurm", "4242")),
        (V2_SLURM, Owner("slurm", "4242")),
        (V2_DOCKER, Owner("container", CTR)),
        (V1_DOCKER, Owner("container", CTR)),
        (V2_PODMAN, Owner("container", CTR)),
        (V2_UNIT, Owner("systemd", "trainer.service")),
        (V2_USER_UNIT, Owner("systemd", "job-7.service")),
        (V2_SESSION, None),
        ("", None),
        ("garbage without colons", None),
    ],
)
def test_cgroup_lines_name_the_owner(text: str, owner: Owner | None) -> None:
    assert owner_from_cgroup(text) == owner


def test_a_nul_in_a_cgroup_path_never_reaches_the_owner() -> None:
    assert owner_from_cgroup("0::/system.slice/tra\0iner.service") == Owner(
        "systemd", "trainer.service"
    )


def test_a_job_path_outside_slurm_and_a_pod_outside_kubepods_name_nothing() -> None:
    assert owner_from_cgroup("0::/home/job_12/x") is None
    assert owner_from_cgroup(f"0::/machine.slice/pod{POD}") is None


def test_the_reservation_comes_from_the_environment_nul_separated() -> None:
    env = b"PATH=/usr/bin\0GPUFLEET_RESERVATION_ID=rsv_01jabc\0HOME=/root\0"
    assert owner_from_environ(env) == Owner("reservation", "rsv_01jabc")
    assert owner_from_environ(b"PATH=/bin\0XGPUFLEET_RESERVATION_ID=rsv_1\0") is None
    assert owner_from_environ(b"GPUFLEET_RESERVATION_ID=\0") is None
    long = owner_from_environ(b"GPUFLEET_RESERVATION_ID=" + b"x" * 5000)
    assert long is not None and len(long.id) == MAX_OWNER


_uid = st.uuids().map(str)
_ctr = st.text("0123456789abcdef", min_size=64, max_size=64)
_qos = st.sampled_from(["", "burstable", "besteffort"])


@given(_uid, _ctr, _qos, st.sampled_from(["cri-containerd", "crio", "docker"]))
def test_any_pod_uid_is_found_under_either_cgroup_driver(
    uid: str, ctr: str, qos: str, runtime: str
) -> None:
    slice_ = f"kubepods-{qos}-pod" if qos else "kubepods-pod"
    systemd = (
        f"0::/kubepods.slice/{f'kubepods-{qos}.slice/' if qos else ''}"
        f"{slice_}{uid.replace('-', '_')}.slice/{runtime}-{ctr}.scope"
    )
    cgroupfs = f"4:memory:/kubepods/{qos + '/' if qos else ''}pod{uid}/{ctr}\n0::/"
    assert owner_from_cgroup(systemd) == Owner("pod", uid)
    assert owner_from_cgroup(cgroupfs) == Owner("pod", uid)


@given(st.integers(1, 10**12), st.sampled_from(["step_0", "step_batch", "step_extern"]))
def test_any_slurm_job_is_found_in_v1_and_v2(job: int, step: str) -> None:
    v1 = f"7:devices:/slurm/uid_1000/job_{job}/{step}/task_0\n1:name=systemd:/user.slice"
    v2 = f"0::/system.slice/slurmstepd.scope/job_{job}/{step}/user/task_0"
    assert owner_from_cgroup(v1) == owner_from_cgroup(v2) == Owner("slurm", str(job))


@given(_ctr, st.sampled_from(["docker", "cri-containerd", "libpod"]))
def test_any_container_id_is_found(ctr: str, runtime: str) -> None:
    assert owner_from_cgroup(f"0::/system.slice/{runtime}-{ctr}.scope") == Owner("container", ctr)


@given(st.text(max_size=400))
def test_any_text_parses_to_a_bounded_owner_or_none(text: str) -> None:
    owner = owner_from_cgroup(text)
    assert owner is None or (0 < len(owner.id) <= MAX_OWNER and "\0" not in owner.id)
    env = owner_from_environ(text.encode())
    assert env is None or 0 < len(env.id) <= MAX_OWNER


def test_proc_owners_read_environment_then_cgroup_and_cache_per_process(tmp_path: Path) -> None:
    procs = FakeProcs(tmp_path)
    booked = Workload(pid=10, gpus=(0,), env=(("GPUFLEET_RESERVATION_ID", "rsv_1"),))
    pod = Workload(pid=11, gpus=(0,), cgroup=V2_KUBE_SYSTEMD)
    procs.sync((booked, pod))
    owners = ProcOwners(tmp_path)
    assert owners.owner(10) == Owner("reservation", "rsv_1")
    assert owners.owner(11) == Owner("pod", POD)
    assert owners.owner(12) == UNKNOWN  # no such process (exited, or another namespace)
    # The same process is not read again: a changed file is not seen...
    (tmp_path / "11" / "cgroup").write_text(V2_UNIT)
    assert owners.owner(11) == Owner("pod", POD)
    # ...but a new process under the same pid (another start time) is.
    procs.sync((booked, Workload(pid=11, gpus=(0,), cgroup=V2_DOCKER)))
    assert owners.owner(11) == Owner("container", CTR)
    owners.keep_only([10])
    procs.sync((booked,))
    assert owners.owner(11) == UNKNOWN


def test_an_unreadable_environment_falls_back_to_the_cgroup(tmp_path: Path) -> None:
    env = (("GPUFLEET_RESERVATION_ID", "rsv_2"),)
    FakeProcs(tmp_path).sync((Workload(pid=20, gpus=(0,), cgroup=V2_SLURM, env=env),))
    environ = tmp_path / "20" / "environ"
    if os.geteuid() == 0:  # root reads any file: make it unreadable another way
        environ.unlink()
        environ.mkdir()
    else:
        environ.chmod(0)
    assert ProcOwners(tmp_path).owner(20) == Owner("slurm", "4242")


def test_the_fake_tree_refuses_the_hosts_proc() -> None:
    with pytest.raises(ValueError, match="host's /proc"):
        FakeProcs(Path("/proc"))


def test_a_pod_is_named_by_namespace_and_name_and_a_job_by_its_user(tmp_path: Path) -> None:
    """Names where /proc gives them (issue 34): a pod's container has its name as
    `HOSTNAME` and its namespace in the service account's file under its root; a Slurm
    job's process has its user's uid. The id stays what it was (the pod UID, the job)."""
    env = (("HOSTNAME", "train-0"), ("PATH", "/usr/bin"))
    job = Workload(pid=31, gpus=(0,), cgroup=V2_SLURM)
    FakeProcs(tmp_path).sync((Workload(pid=30, gpus=(0,), cgroup=V2_KUBE_SYSTEMD, env=env), job))
    secrets = tmp_path / "30" / "root" / "var/run/secrets/kubernetes.io/serviceaccount"
    secrets.mkdir(parents=True)
    (secrets / "namespace").write_text("ml\n")
    (tmp_path / "31" / "status").write_text(f"Name:\tpython\nUid:\t{os.getuid()}\t0\t0\t0\n")
    owners = ProcOwners(tmp_path)
    assert owners.owner(30) == Owner("pod", POD, "ml/train-0")
    assert owners.owner(31) == Owner("slurm", "4242", pwd.getpwuid(os.getuid()).pw_name)


def test_a_pod_with_no_readable_namespace_has_no_name(tmp_path: Path) -> None:
    env = (("HOSTNAME", "train-0"),)
    FakeProcs(tmp_path).sync((Workload(pid=30, gpus=(0,), cgroup=V2_KUBE_SYSTEMD, env=env),))
    assert ProcOwners(tmp_path).owner(30) == Owner("pod", POD)


def _container_host(tmp_path: Path, cgroup: str, env: tuple[tuple[str, str], ...] = ()) -> Path:
    """A fake host root: `proc/40` a container's process (its id in the cgroup)."""
    FakeProcs(tmp_path / "proc").sync((Workload(pid=40, gpus=(0,), cgroup=cgroup, env=env),))
    return tmp_path


def _write_json(path: Path, value: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value))


def test_a_docker_container_is_named_by_its_config(tmp_path: Path) -> None:
    """Issue 34: a container's owner names it as `docker ps` does, from Docker's own
    file for the id the cgroup gave; its hostname (the short id) does not win."""
    host = _container_host(tmp_path, V2_DOCKER, (("HOSTNAME", CTR[:12]),))
    config = host / "var/lib/docker/containers" / CTR / "config.v2.json"
    _write_json(config, {"ID": CTR, "Name": "/trainer"})
    assert ProcOwners(host / "proc", host).owner(40) == Owner("container", CTR, "trainer")


def test_a_containerd_container_is_named_by_its_bundles_annotation(tmp_path: Path) -> None:
    host = _container_host(tmp_path, f"0::/system.slice/nerdctl-x.slice/{CTR}")
    spec = host / "run/containerd/io.containerd.runtime.v2.task/default" / CTR / "config.json"
    _write_json(spec, {"ociVersion": "1.1.0", "annotations": {"nerdctl/name": "eval-1"}})
    assert ProcOwners(host / "proc", host).owner(40) == Owner("container", CTR, "eval-1")


def test_a_podman_container_is_named_by_the_storage_index(tmp_path: Path) -> None:
    host = _container_host(tmp_path, V2_PODMAN)
    index = host / "var/lib/containers/storage/overlay-containers/containers.json"
    _write_json(index, [{"id": "f" * 64, "names": ["other"]}, {"id": CTR, "names": ["sweep"]}])
    assert ProcOwners(host / "proc", host).owner(40) == Owner("container", CTR, "sweep")


def test_a_container_without_readable_runtime_files_is_named_by_its_hostname(
    tmp_path: Path,
) -> None:
    """Unreadable or broken runtime files are passed over, never lose the owner."""
    host = _container_host(tmp_path, V2_DOCKER, (("HOSTNAME", "gpu-box"),))
    config = host / "var/lib/docker/containers" / CTR / "config.v2.json"
    config.parent.mkdir(parents=True)
    config.write_text("{not json")
    assert ProcOwners(host / "proc", host).owner(40) == Owner("container", CTR, "gpu-box")
    bare = _container_host(tmp_path / "bare", V2_DOCKER)
    assert ProcOwners(bare / "proc", bare).owner(40) == Owner("container", CTR)


def test_a_slurm_job_in_a_bookings_reservation_is_that_bookings() -> None:
    """Without the TaskProlog's GPUFLEET_RESERVATION_ID, the bridge's reservation name
    in SLURM_JOB_RESERVATION (whole booking, per node, or among others) names it."""
    env = b"PATH=/bin\0SLURM_JOB_ID=42\0SLURM_JOB_RESERVATION=gpufleet-rsv_01jabc\0"
    assert owner_from_environ(env) == Owner("reservation", "rsv_01jabc")
    per_node = b"SLURM_JOB_RESERVATION=maint,gpufleet-rsv_01jabc--h100-b\0"
    assert owner_from_environ(per_node) == Owner("reservation", "rsv_01jabc")
    # The variable the TaskProlog exported wins; a reservation gpufleet did not make,
    # or a name no bridge makes, names nothing (the cgroup decides).
    both = b"SLURM_JOB_RESERVATION=gpufleet-rsv_a\0GPUFLEET_RESERVATION_ID=rsv_b\0"
    assert owner_from_environ(both) == Owner("reservation", "rsv_b")
    assert owner_from_environ(b"SLURM_JOB_RESERVATION=maint\0") is None
    assert owner_from_environ(b"SLURM_JOB_RESERVATION=gpufleet-a b\0") is None
    assert owner_from_environ(b"SLURM_JOB_RESERVATION=gpufleet-\0") is None
