"""A booking's QOS caps its jobs (issue 33, point 1, on Slurm before 23.11): the shipped
job_submit.lua with BOOKING_QOS on puts a job in reservation `gpufleet-<id>--<node>`
under QOS `gpufleet-<id>`, whose `GrpTRES=gres/gpu:h100=2` (slurmdbd,
AccountingStorageEnforce=limits) lets the booking's jobs together hold 2 GPUs: a job
asking 3 is never started, and while a 2-GPU job runs a second one waits on the QOS,
then runs when it ends. The QOS is made by hand here, to show Slurm's side alone; the
bridge's own (tests/e2e/test_slurm_booking_qos.py) makes it as a booking is reserved."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.e2e.fleet_procs import wait_for
from tests.slurm_accounting import require_slurmdbd
from tests.slurm_cluster import SlurmCluster, SlurmConfig, SlurmError, node_line

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]
LUA = Path(__file__).parents[2] / "ops" / "slurm" / "job_submit.lua"
RSV, QOS = "gpufleet-rsv_01qos--n1", "gpufleet-rsv_01qos"


def _batch(cluster: SlurmCluster, *args: str) -> str:
    out = cluster.run("sbatch", "--parsable", "-o", "/dev/null", "--mem=100", *args,
                      "--wrap", "sleep 600").stdout  # fmt: skip
    return out.strip().split(";")[0]


def _job(cluster: SlurmCluster, job: str) -> tuple[str, str, str]:
    """squeue's (state, reason, qos) of a job."""
    out = cluster.run("squeue", "-h", "-j", job, "-o", "%T|%r|%q", check=False).stdout.strip()
    state, _, rest = out.partition("|")
    reason, _, qos = rest.partition("|")
    return state, reason, qos


def test_a_booking_s_qos_holds_its_jobs_to_the_booked_gpus(slurm_cluster: SlurmCluster) -> None:
    require_slurmdbd()
    etc = slurm_cluster.root / "etc"
    etc.mkdir(parents=True, exist_ok=True)
    (etc / "job_submit.lua").write_text(
        LUA.read_text().replace("local BOOKING_QOS = false", "local BOOKING_QOS = true")
    )
    dev = slurm_cluster.dev_dir
    cluster = slurm_cluster.start(
        SlurmConfig(
            nodes=[node_line("n1", gres="gpu:h100:8", cpus=4)],
            gres_conf=f"NodeName=n1 Name=gpu Type=h100 File={dev}/nvidia[0-7]\n",
            slurmdbd=True,
            accounting_tres=("gres/gpu", "gres/gpu:h100"),
            extra=["JobSubmitPlugins=lua", "AccountingStorageEnforce=limits"],
        ),
        timeout_s=60,
    )
    cluster.run("sacctmgr", "-i", "add", "qos", QOS, "set", "GrpTRES=gres/gpu:h100=2")
    cluster.scontrol("create", "reservation", f"ReservationName={RSV}", "Nodes=n1",
                     "Users=root", "StartTime=now", "Duration=10",
                     "Flags=IGNORE_JOBS")  # fmt: skip
    deadline = time.monotonic() + 20  # slurmctld learns the new QOS from slurmdbd
    while True:
        try:
            first = _batch(cluster, f"--reservation={RSV}", "--gres=gpu:h100:2")
            break
        except SlurmError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    wait_for(lambda: _job(cluster, first)[0] == "RUNNING", timeout=30, what="the booked job")
    assert _job(cluster, first)[2] == QOS
    second = _batch(cluster, f"--reservation={RSV}", "--gres=gpu:h100:1")
    too_big = _batch(cluster, f"--reservation={RSV}", "--gres=gpu:h100:3")
    for job in (second, too_big):
        wait_for(lambda j=job: _job(cluster, j)[1].startswith("QOSGrp"), timeout=30,  # type: ignore[misc]
                 what=f"job {job} held by the booking's QOS")  # fmt: skip
        assert _job(cluster, job)[0] == "PENDING"
    # The cap is the booking's, not the node's: once its job ends the next one runs.
    cluster.run("scancel", first)
    wait_for(lambda: _job(cluster, second)[0] == "RUNNING", timeout=30, what="the next job")
    assert _job(cluster, too_big)[0] == "PENDING"
