"""The Slurm test harness itself (tests/slurm_cluster.py) against Debian's real
slurmctld and slurmd: two nodes register with their GPUs, a job gets the GPU it asked
for, a reservation and a drain show where the bridge's tests will look for them, and
closing leaves no daemon behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.e2e.fleet_procs import wait_for
from tests.slurm_cluster import (
    SlurmCluster,
    SlurmConfig,
    SlurmError,
    gres_files,
    node_line,
    parse_record,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def _two_nodes(cluster: SlurmCluster) -> SlurmCluster:
    dev = cluster.dev_dir
    return cluster.start(
        SlurmConfig(
            nodes=[node_line(n, gres="gpu:h100:2", cpus=2) for n in ("sim-a", "sim-b")],
            gres_conf=f"""NodeName=sim-a Name=gpu Type=h100 File={dev}/nvidia[0-1]
NodeName=sim-b Name=gpu Type=h100 File={dev}/nvidia2
NodeName=sim-b Name=gpu Type=h100 File={dev}/nvidia3
""",
        )
    )


def test_nodes_register_with_their_gpus_and_jobs_get_them(slurm_cluster: SlurmCluster) -> None:
    cluster = _two_nodes(slurm_cluster)
    assert cluster.node_states() == {"sim-a": "idle", "sim-b": "idle"}
    assert cluster.node("sim-a")["Gres"] == "gpu:h100:2"
    assert cluster.sinfo("-h", "-N", "-o", "%N %G").split("\n")[0] == "sim-a gpu:h100:2"

    done = cluster.srun("-w", "sim-b", "--gres=gpu:h100:1", "printenv", "SLURMD_NODENAME")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "sim-b"
    # Three GPUs on a two-GPU node: Slurm refuses, as it would on a real one.
    refused = cluster.srun("-w", "sim-a", "--gres=gpu:h100:3", "--immediate=2", "true")
    assert refused.returncode != 0


def test_reservations_and_drains_show_in_scontrol_and_sinfo(slurm_cluster: SlurmCluster) -> None:
    cluster = _two_nodes(slurm_cluster)
    cluster.scontrol(
        "create", "reservation", "ReservationName=gpufleet-r1", "Nodes=sim-a", "Users=root",
        "StartTime=now", "Duration=10",
    )  # fmt: skip
    held = cluster.reservations()["gpufleet-r1"]
    assert held["Nodes"] == "sim-a" and held["State"] == "ACTIVE"
    inside = cluster.srun("--reservation=gpufleet-r1", "printenv", "SLURMD_NODENAME")
    assert inside.stdout.strip() == "sim-a", inside.stderr

    cluster.scontrol("update", "NodeName=sim-b", "State=DRAIN", "Reason=gpufleet: maintenance")
    cluster.wait_nodes(["sim-b"], "drain")
    assert cluster.node("sim-b")["Reason"].startswith("gpufleet: maintenance")
    cluster.scontrol("update", "NodeName=sim-b", "State=RESUME")
    cluster.wait_nodes(["sim-b"], "idle")


def test_close_stops_every_daemon(slurm_cluster: SlurmCluster) -> None:
    cluster = _two_nodes(slurm_cluster)
    pids = [p.pid for p in cluster.procs.values()]
    assert len(pids) == 4  # munged, slurmctld, two slurmd
    # A running job: its slurmstepd and the job's own process must go too.
    cluster.run("sbatch", "-w", "sim-a", f"--chdir={cluster.root}", "--wrap", f"sleep {JOB_S}")
    wait_for(lambda: _job_pids() != [], timeout=15, what="the job running")
    root = cluster.root
    cluster.close()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert _job_pids() == []
    assert not root.exists()


JOB_S = 3131  # a sleep no other test runs


def _job_pids() -> list[int]:
    out = []
    for proc in Path("/proc").iterdir():
        try:
            if (
                proc.name.isdigit()
                and (proc / "cmdline").read_bytes() == f"sleep\0{JOB_S}\0".encode()
            ):
                out.append(int(proc.name))
        except OSError:
            continue
    return out


def test_gres_paths_and_records_parse() -> None:
    conf = "NodeName=x Name=gpu File=/d/nvidia[0-2,5]\nName=gpu MultipleFiles=/d/a1,/d/c/b21 # c"
    assert gres_files(conf) == [
        "/d/nvidia0", "/d/nvidia1", "/d/nvidia2", "/d/nvidia5", "/d/a1", "/d/c/b21",
    ]  # fmt: skip
    record = parse_record("NodeName=n1 State=IDLE+DRAIN Reason=gpufleet: xid 79 [root@t]")
    assert record == {
        "NodeName": "n1",
        "State": "IDLE+DRAIN",
        "Reason": "gpufleet: xid 79 [root@t]",
    }


def test_a_node_unlike_its_gres_conf_fails_start_with_slurms_reason(
    slurm_cluster: SlurmCluster,
) -> None:
    # What makes the conf tests able to fail: Slurm refuses a node whose Gres= count
    # is more than gres.conf gives it, and start() says so at once.
    dev = slurm_cluster.dev_dir
    config = SlurmConfig(
        nodes=[node_line("sim-a", gres="gpu:h100:3")],
        gres_conf=f"NodeName=sim-a Name=gpu Type=h100 File={dev}/nvidia[0-1]\n",
    )
    with pytest.raises(SlurmError, match=r"gres/gpu count reported lower than configured"):
        slurm_cluster.start(config, timeout_s=20)
