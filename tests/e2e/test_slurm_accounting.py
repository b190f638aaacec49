"""Slurm with a real slurmdbd (tests/slurm_accounting.py, over the local MariaDB): the
controller accepts `AccountingStorageTRES=gres/gpu,gres/gpu:h100`, which it refuses
without slurmdbd, the TRES and the test user's account are in the database, and the
per-test database is gone after `close()`.

GPU-level reservations: a reservation by `TRES=gres/gpu:h100=4` on an 8-GPU node lets
a job in it take 4 GPUs and leaves the other 4, and no more, to jobs outside. Slurm
reserves GRES from 23.11 on ("Make it so reservations can reserve GRES", its release
notes); 22.05 (Debian 12) and 23.02, slurmdbd or not, take only cpu, node, license and
bb in a reservation's TRES ("TRES type 'gres/gpu:h100' not supported with
reservations"). There the second test skips saying so, and the bridge's whole-node mode
(`gpu_tres = "off"`) is what withholds booked GPUs.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.e2e.fleet_procs import wait_for
from tests.slurm_accounting import gres_reservations_refused, mysql, require_slurmdbd
from tests.slurm_cluster import SlurmCluster, SlurmConfig, node_line

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]
GPU_TRES = ("gres/gpu", "gres/gpu:h100")
NO_GRES_RESERVATIONS = "not supported with reservations"


@pytest.fixture
def cluster(slurm_cluster: SlurmCluster) -> SlurmCluster:
    """One node, n1, with 8 H100s, accounting through slurmdbd and GPU TRES."""
    require_slurmdbd()
    dev = slurm_cluster.dev_dir
    return slurm_cluster.start(
        SlurmConfig(
            nodes=[node_line("n1", gres="gpu:h100:8", cpus=2)],
            gres_conf=f"NodeName=n1 Name=gpu Type=h100 File={dev}/nvidia[0-7]\n",
            slurmdbd=True,
            accounting_tres=GPU_TRES,
        ),
        timeout_s=60,  # slurmdbd makes its tables on first start
    )


def _tres(cluster: SlurmCluster) -> set[str]:
    out = cluster.run("sacctmgr", "-n", "-P", "show", "tres", "format=type,name").stdout
    return {"/".join(filter(None, line.split("|"))) for line in out.splitlines()}


def test_slurmdbd_accounts_gpu_tres_and_its_database_is_dropped(
    cluster: SlurmCluster, tmp_path: Path
) -> None:
    config = cluster.scontrol("show", "config")
    assert re.search(r"AccountingStorageType\s*=\s*accounting_storage/slurmdbd", config)
    assert re.search(r"AccountingStorageTRES\s*=.*gres/gpu:h100", config)
    # slurmctld pushes its TRES to slurmdbd when it registers.
    wait_for(lambda: set(GPU_TRES) <= _tres(cluster), timeout=15, what="GPU TRES in slurmdbd")
    users = cluster.run("sacctmgr", "-n", "-P", "show", "user", "root",
                        "withassoc", "format=user,account,cluster").stdout  # fmt: skip
    assert "root|gpufleet-test|gpufleet-test" in users.splitlines()
    done = cluster.srun("-w", "n1", "--gres=gpu:h100:2", "printenv", "CUDA_VISIBLE_DEVICES")
    assert done.returncode == 0 and done.stdout.strip() == "0,1", done.stderr

    assert cluster.dbd is not None
    database = cluster.dbd.database
    assert database in mysql("SHOW DATABASES").split()
    cluster.close(keep_logs=tmp_path / "slurm")
    assert database not in mysql("SHOW DATABASES").split()


def test_a_gpu_tres_reservation_withholds_only_the_booked_gpus(cluster: SlurmCluster) -> None:
    refused = gres_reservations_refused(cluster, "n1", "gres/gpu:h100=4")
    if NO_GRES_RESERVATIONS in refused:
        pytest.skip(refused)
    assert not refused, refused
    cluster.scontrol(
        "create", "reservation", "ReservationName=gpufleet-r4", "Nodes=n1",
        "TRES=gres/gpu:h100=4", "Users=root", "StartTime=now", "Duration=10", "Flags=OVERLAP",
    )  # fmt: skip
    held = cluster.reservations()["gpufleet-r4"]
    assert held["Nodes"] == "n1" and "gres/gpu:h100=4" in held["TRES"]

    inside = cluster.srun("--reservation=gpufleet-r4", "--gres=gpu:h100:4", "true")
    assert inside.returncode == 0, inside.stderr
    # Outside the reservation: the 4 unbooked GPUs, not a fifth.
    outside = cluster.srun("-w", "n1", "--gres=gpu:h100:4", "--immediate=5", "true")
    assert outside.returncode == 0, outside.stderr
    fifth = cluster.srun("-w", "n1", "--gres=gpu:h100:5", "--immediate=3", "true")
    assert fifth.returncode != 0
