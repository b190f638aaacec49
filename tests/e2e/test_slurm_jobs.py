"""The bridge's Slurm adapter (`ops.slurm.bridge.scontrol.Scontrol`) against a real Slurm
with jobs running (tests/slurm_cluster.py): a booking is reserved at once on a node a job
already runs on (`IGNORE_JOBS`), and a released booking ends in Slurm although a job
runs in it: Slurm ends the reservation and that job, and leaves the job outside alone.
The shipped TaskProlog gives a task in a booking's reservation its
GPUFLEET_RESERVATION_ID and leaves the GPUs Slurm chose as they are; on the demo's A100
host (two GPUs in MIG mode, gres.conf from `slurm conf`) it names them by the UUIDs
the agent's inventory gives Slurm's gres indexes, so a MIG job gets MIG UUIDs: from the
file the running agent daemon keeps, else from NVML."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ops.kit.embedded_nats import free_port
from ops.slurm.bridge.model import CreateReservation, DeleteReservation, SlurmReservation
from ops.slurm.bridge.scontrol import Scontrol, ScontrolConfig
from ops.slurm.conf import Options, nodes_from_api, render
from tests.e2e.fleet_procs import stop, wait_for
from tests.slurm_cluster import SlurmCluster, SlurmConfig, node_line
from tests.unit.agent.test_inventory import inventory_of
from tests.unit.ops.slurm.test_conf import api_node

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]
NAME = "gpufleet-rsv_jobs"


PROLOG = Path(__file__).parents[2] / "ops" / "slurm" / "task_prolog.sh"


def _start(cluster: SlurmCluster, *extra: str) -> SlurmCluster:
    dev = cluster.dev_dir
    return cluster.start(
        SlurmConfig(
            nodes=[node_line("sim-a", gres="gpu:h100:8", cpus=4)],
            gres_conf=f"NodeName=sim-a Name=gpu Type=h100 File={dev}/nvidia[0-7]\n",
            extra=extra,
        )
    )


def _batch(cluster: SlurmCluster, *args: str) -> str:
    """A job sleeping until cancelled; its id."""
    out = cluster.run("sbatch", "--parsable", "-o", "/dev/null", "--mem=100", *args,
                      "--wrap", "sleep 600").stdout  # fmt: skip
    return out.strip().split(";")[0]


def _state(cluster: SlurmCluster, job: str) -> str:
    """squeue's state of a job; empty once it has left the queue."""
    return cluster.run("squeue", "-h", "-j", job, "-o", "%T", check=False).stdout.strip()


def test_create_ignores_running_jobs_and_release_ends_the_jobs_in_it(
    slurm_cluster: SlurmCluster,
) -> None:
    cluster = _start(slurm_cluster)
    scontrol = Scontrol(ScontrolConfig("scontrol", str(cluster.conf_path)))
    outside = _batch(cluster, "-w", "sim-a", "--gres=gpu:h100:1")
    wait_for(lambda: _state(cluster, outside) == "RUNNING", timeout=30, what="a job running")

    now_s = int(time.time())
    want = SlurmReservation(
        name=NAME, nodes=frozenset({"sim-a"}), start_s=now_s, end_s=now_s + 3600,
        users=frozenset({"root"}),
    )  # fmt: skip
    # Without IGNORE_JOBS Slurm refuses this ("Requested nodes are busy") until the job ends.
    asyncio.run(scontrol.apply(CreateReservation(want), now_s))
    assert NAME in cluster.reservations()

    inside = _batch(cluster, f"--reservation={NAME}", "--gres=gpu:h100:1")
    wait_for(lambda: _state(cluster, inside) == "RUNNING", timeout=30, what="a job inside")

    # Slurm refuses to delete a reservation in use; the release still ends it.
    asyncio.run(scontrol.apply(DeleteReservation(NAME), int(time.time())))
    wait_for(lambda: NAME not in cluster.reservations(), timeout=30, what="the reservation gone")
    wait_for(lambda: _state(cluster, inside) in ("", "COMPLETING", "CANCELLED", "TIMEOUT"),
             timeout=30, what="the job inside ended")  # fmt: skip
    assert _state(cluster, outside) == "RUNNING"
    # A second delete (the next pass, had it seen it) is success: it is gone.
    asyncio.run(scontrol.apply(DeleteReservation(NAME), int(time.time())))


def test_the_task_prolog_names_the_booking_and_keeps_slurms_gpus(
    slurm_cluster: SlurmCluster,
) -> None:
    cluster = _start(slurm_cluster, f"TaskProlog={PROLOG}")
    show = "echo $GPUFLEET_RESERVATION_ID $CUDA_VISIBLE_DEVICES"
    outside = cluster.srun("--mem=100", "--gres=gpu:h100:1", "sh", "-c", show)
    assert outside.returncode == 0, outside.stderr
    assert outside.stdout.split() == ["0"]  # no booking: nothing set, Slurm's GPU kept
    now_s = int(time.time())
    want = SlurmReservation(
        name="gpufleet-rsv_01prolog--sim-a", nodes=frozenset({"sim-a"}), start_s=now_s,
        end_s=now_s + 3600, users=frozenset({"root"}),
    )  # fmt: skip
    scontrol = Scontrol(ScontrolConfig("scontrol", str(cluster.conf_path)))
    asyncio.run(scontrol.apply(CreateReservation(want), now_s))
    inside = cluster.srun("--mem=100", f"--reservation={want.name}", "--gres=gpu:h100:2",
                          "sh", "-c", show)  # fmt: skip
    assert inside.returncode == 0, inside.stderr
    assert inside.stdout.split() == ["rsv_01prolog", "0,1"]


def test_the_task_prolog_gives_a_mig_job_mig_uuids(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    inv = inventory_of("a100-mig-8", tmp_path / "inv", "a100-m")
    conf = render("p", nodes_from_api([api_node(inv)]), Options(dev_dir=str(slurm_cluster.dev_dir)))
    gres = "".join(f"{x}\n" for x in conf.gres.splitlines() if x.startswith("NodeName="))
    line = next(x for x in conf.nodes.splitlines() if x.startswith("NodeName="))
    slurm_cluster.start(SlurmConfig(nodes=[line], gres_conf=gres, extra=[f"TaskProlog={PROLOG}"]))
    # The agent daemon on the simulated host (no NATS needed to poll) keeps its GPU map
    # in its runtime directory; the prolog's agent settings name that directory and no
    # simulated NVML, so the UUIDs can only come from the daemon's file.
    run = tmp_path / "run"
    run.mkdir()  # as systemd's RuntimeDirectory= would
    agent = Path(sys.executable).parent / "gpufleet-agent"
    daemon = subprocess.Popen(
        [str(agent), "--pool-id", "pool_" + "1" * 26, "--node-id", "a100-m", "--simulate",
         "a100-mig-8", "--runtime-dir", str(run), "--interval", "1",
         "--nats-url", f"nats://127.0.0.1:{free_port()}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    migs = {m.uuid: (g.index, m.profile) for g in inv.gpus for m in g.mig_instances}
    whole = {g.uuid: g.index for g in inv.gpus if not g.mig_enabled}
    config = tmp_path / "agent.toml"
    try:
        wait_for((run / "gpus.json").exists, timeout=60, what="the GPU map file")
        config.write_text(f'node_id = "a100-m"\nruntime_dir = "{run}"\n')
        small = _visible(slurm_cluster, config, "gpu:a100_1g.10gb:2")  # Slurm's: indexes 6,7
        assert len(small) == 2 and all(migs.get(u, (0, ""))[1] == "1g.10gb" for u in small)
        [big] = _visible(slurm_cluster, config, "gpu:a100_3g.40gb:1")
        assert migs[big] == (0, "3g.40gb")
        two = _visible(slurm_cluster, config, "gpu:a100:2")
        assert len(two) == 2 and all(u in whole for u in two)
    finally:
        stop(daemon)
    # No daemon's file (an agent not started yet): gres-uuids reads the simulated NVML.
    config.write_text(f'node_id = "a100-m"\nsimulate = "a100-mig-8"\nruntime_dir = "{tmp_path}"\n')
    [big] = _visible(slurm_cluster, config, "gpu:a100_3g.40gb:1")
    assert migs[big] == (0, "3g.40gb")


def _visible(cluster: SlurmCluster, config: Path, gres_ask: str) -> list[str]:
    """CUDA_VISIBLE_DEVICES in a task asking for `gres_ask`, the prolog's agent
    configured by `config`."""
    agent = Path(sys.executable).parent / "gpufleet-agent"
    export = f"--export=ALL,GPUFLEET_AGENT={agent},GPUFLEET_CONFIG={config}"
    done = cluster.srun("--mem=100", export, f"--gres={gres_ask}", "sh", "-c",
                        "echo $CUDA_VISIBLE_DEVICES")  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(",")
