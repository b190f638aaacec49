"""Slurm 22.05 holds each workload to its booking by cores (`gpu_tres = "cores"`), on a
real cluster (tests/slurm_cluster.py): `gpufleet slurm conf --socket-per-gpu` gives each
GPU a socket of its own cores, the shipped job_submit.lua (ops/slurm/job_submit.lua)
forces --gres-flags=enforce-binding on GPU jobs, and the bridge's planner and scontrol
adapter reserve each booking's GPUs' cores. Two tenants on one node: each booked job
gets its count and no more, a job outside gets only the unbooked GPUs."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import pytest

from ops.slurm.bridge.model import Ledger, LedgerReservation
from ops.slurm.bridge.planner import Policy, plan
from ops.slurm.bridge.scontrol import Scontrol, ScontrolConfig
from ops.slurm.conf import Options, render
from tests.slurm_cluster import SlurmCluster, SlurmConfig, two_socket_h100_host

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]
LUA = Path(__file__).parents[2] / "ops" / "slurm" / "job_submit.lua"


def _booking(rid: str, tenant: str, gpus: int) -> LedgerReservation:
    now = int(time.time() * 1000)
    return LedgerReservation(
        reservation_id=rid, tenant_id=tenant, pool_id="p", state="active",
        start_ms=now - 60_000, end_ms=now + 3_600_000, nodes=frozenset({"sim-a"}),
        gpus={"sim-a": gpus},
    )  # fmt: skip


def _gpus(cluster: SlurmCluster, *args: str) -> set[int] | None:
    """The GPUs a job with `args` gets (None: Slurm refused it)."""
    done = cluster.srun("--mem=100", "--immediate=5", *args, "printenv", "CUDA_VISIBLE_DEVICES")
    if done.returncode != 0:
        return None
    return {int(i) for i in done.stdout.strip().split(",")}


def test_two_tenants_on_one_node_each_get_their_booked_gpus_and_no_more(
    slurm_cluster: SlurmCluster,
) -> None:
    cluster = slurm_cluster
    conf = render(
        "p", [two_socket_h100_host()], Options(dev_dir=str(cluster.dev_dir), socket_per_gpu=True)
    )
    (node_line,) = [x for x in conf.nodes.splitlines() if x.startswith("NodeName=")]
    assert "Sockets=8 CoresPerSocket=2 ThreadsPerCore=1" in node_line
    (cluster.root / "etc").mkdir(exist_ok=True)
    shutil.copy(LUA, cluster.root / "etc" / "job_submit.lua")
    cluster.start(SlurmConfig(nodes=[node_line], gres_conf=conf.gres,
                              extra=["JobSubmitPlugins=lua"]))  # fmt: skip

    scontrol = Scontrol(ScontrolConfig("scontrol", str(cluster.conf_path)))
    policy = Policy(users={"acme": ("root",), "globex": ("root",)}, gpu_tres="cores")
    ledger = Ledger(
        (_booking("rsv_acme", "acme", 4), _booking("rsv_globex", "globex", 2)), (),
        int(time.time() * 1000),
    )  # fmt: skip

    async def reconcile() -> int:
        state = await scontrol.state()
        assert state.nodes["sim-a"].cores_per_gpu == 2
        actions = plan(ledger, state, policy).actions
        for action in actions:
            await scontrol.apply(action, ledger.at_ms // 1000)
        return len(actions)

    assert asyncio.run(reconcile()) == 2
    assert asyncio.run(reconcile()) == 0  # in step: Slurm shows what was asked
    held = cluster.reservations()
    assert held["gpufleet-rsv_acme"]["CoreCnt"] == "8"
    assert held["gpufleet-rsv_globex"]["CoreCnt"] == "4"

    acme = _gpus(cluster, "--reservation=gpufleet-rsv_acme", "--gres=gpu:h100:4")
    globex = _gpus(cluster, "--reservation=gpufleet-rsv_globex", "--gres=gpu:h100:2")
    outside = _gpus(cluster, "-w", "sim-a", "--gres=gpu:h100:2")
    assert acme is not None and len(acme) == 4, acme
    assert globex is not None and len(globex) == 2, globex
    assert outside is not None and len(outside) == 2, outside
    assert not (acme & globex) and not (outside & (acme | globex))
    # More than booked, or more than is left unbooked: refused.
    assert _gpus(cluster, "--reservation=gpufleet-rsv_acme", "--gres=gpu:h100:5") is None
    assert _gpus(cluster, "--reservation=gpufleet-rsv_globex", "--gres=gpu:h100:3") is None
    assert _gpus(cluster, "-w", "sim-a", "--gres=gpu:h100:3") is None
