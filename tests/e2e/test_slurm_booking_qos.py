"""Slurm 22.05 with accounting holds every workload to its booking (issue 33, point 1):
the bridge's planner and its scontrol and sacctmgr adapters, on a real cluster with a
real slurmdbd (tests/slurm_cluster.py, tests/slurm_accounting.py), the shipped
job_submit.lua with BOOKING_QOS on and `AccountingStorageEnforce=limits,qos`.

Two nodes: sim-a as `gpufleet slurm conf --socket-per-gpu` writes it (core-bound
reservations, `cores+qos`), and n2 without that layout (reserved whole, `nodes+qos`).
acme books 4 GPUs and globex 2 on sim-a, and globex 2 on n2 in a second booking. Each
booking gets its QOS `gpufleet-<id>` (GrpTRES its GPUs) allowed to its user or
account, before its reservation; the daemon reads them with one sacctmgr a pass.
Each booked job gets its count; a job asking more than booked is refused (sim-a: no
cores for it) or never starts (n2: `QOSGrpGRES`, though the node is free); a job
outside gets only the unbooked GPUs. Released while its job runs, a booking's
reservation ends that job and its QOS is gone; a QOS made by hand is never touched; a
fresh reading (the bridge after kill -9) plans nothing more.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest

from ops.slurm.bridge.daemon import SlurmBridge
from ops.slurm.bridge.model import Ledger, LedgerReservation, QosAction, SlurmState
from ops.slurm.bridge.planner import Policy, plan
from ops.slurm.bridge.sacctmgr import Sacctmgr
from ops.slurm.bridge.scontrol import Scontrol, ScontrolConfig, SlurmError
from ops.slurm.bridge.settings import BridgeSettings
from ops.slurm.conf import Options, render
from tests.slurm_accounting import require_slurmdbd
from tests.slurm_cluster import (
    SlurmCluster,
    SlurmConfig,
    node_line,
    tool_path,
    two_socket_h100_host,
)
from tests.waiting import eventually

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
LUA = Path(__file__).parents[2] / "ops" / "slurm" / "job_submit.lua"
ACCOUNT = "gpufleet-test"  # the cluster's account for the test user (root)
# slurmctld hears of a new QOS and association from slurmdbd: seconds, more when loaded.
WITHIN_S = 60.0


def _booking(
    rid: str, tenant: str, gpus: dict[str, int], state: str = "active"
) -> LedgerReservation:
    now = int(time.time() * 1000)
    return LedgerReservation(
        reservation_id=rid, tenant_id=tenant, pool_id="p", state=state,
        start_ms=now - 60_000, end_ms=now + 3_600_000, nodes=frozenset(gpus), gpus=gpus,
    )  # fmt: skip


class Bridge:
    """One pass of the bridge, as its daemon runs it (state, QOS, plan, apply)."""

    def __init__(self, cluster: SlurmCluster, policy: Policy) -> None:
        config = ScontrolConfig("scontrol", str(cluster.conf_path), 20.0)
        self.scontrol = Scontrol(config)
        self.sacctmgr = Sacctmgr(ScontrolConfig("sacctmgr", str(cluster.conf_path), 20.0))
        self.policy = policy

    async def state(self) -> SlurmState:
        state = await self.scontrol.state()
        return SlurmState(state.reservations, state.nodes, await self.sacctmgr.qos())

    async def reconcile(self, ledger: Ledger) -> list[str]:
        ledger = replace(ledger, at_ms=int(time.time() * 1000))  # read now, as each pass does
        actions = plan(ledger, await self.state(), self.policy).actions
        for action in actions:
            if isinstance(action, QosAction):
                await self.sacctmgr.apply(action)
            else:
                await self.scontrol.apply(action, ledger.at_ms // 1000)
        return [a.kind for a in actions]


def _submit(cluster: SlurmCluster, *args: str) -> str | None:
    """A batch job's id, or None when Slurm refuses it at submission."""
    done = cluster.run("sbatch", "--parsable", "-o", "/dev/null", "--mem=100", *args,
                       "--wrap", "sleep 600", check=False)  # fmt: skip
    return done.stdout.strip().split(";")[0] if done.returncode == 0 else None


def _job(cluster: SlurmCluster, job: str) -> dict[str, str]:
    """squeue's state, reason, QOS and GPUs of a job (empty once it has left)."""
    out = cluster.run("squeue", "-h", "-j", job, "-o", "%T|%r|%q|%b", check=False).stdout
    fields = out.strip().split("|")
    return dict(zip(("state", "reason", "qos", "gres"), fields, strict=False)) if out else {}


def _gpus(cluster: SlurmCluster, *args: str) -> set[int] | None:
    """The GPUs a job with `args` gets at once (None: Slurm refused it)."""
    done = cluster.srun("--mem=100", "--immediate=10", *args, "printenv", "CUDA_VISIBLE_DEVICES",
                        timeout_s=40)  # fmt: skip
    if done.returncode != 0:
        return None
    return {int(i) for i in done.stdout.strip().split(",")}


def _metrics(daemon: SlurmBridge) -> list[str]:
    return daemon.metrics.text().decode().splitlines()


async def _running(cluster: SlurmCluster, *args: str) -> str:
    """Submitted once slurmctld knows the booking's QOS, and running."""
    job: list[str] = []

    async def submitted() -> bool:
        if not job and (made := _submit(cluster, *args)) is not None:
            job.append(made)
        return bool(job) and _job(cluster, job[0]).get("state") == "RUNNING"

    await eventually(submitted, within_s=WITHIN_S)
    return job[0]


async def test_each_booking_s_qos_holds_its_jobs_and_goes_with_the_booking(
    slurm_cluster: SlurmCluster,
) -> None:
    require_slurmdbd()
    cluster = slurm_cluster
    conf = render(
        "p", [two_socket_h100_host()], Options(dev_dir=str(cluster.dev_dir), socket_per_gpu=True)
    )
    (sim_a,) = [x for x in conf.nodes.splitlines() if x.startswith("NodeName=")]
    gres = conf.gres + f"\nNodeName=n2 Name=gpu Type=h100 File={cluster.dev_dir}/nvidia[8-15]\n"
    (cluster.root / "etc").mkdir(exist_ok=True)
    lua = LUA.read_text().replace("local BOOKING_QOS = false", "local BOOKING_QOS = true")
    (cluster.root / "etc" / "job_submit.lua").write_text(lua)
    cluster.start(
        SlurmConfig(
            nodes=[sim_a, node_line("n2", gres="gpu:h100:8", cpus=4)], gres_conf=gres,
            slurmdbd=True, accounting_tres=("gres/gpu", "gres/gpu:h100"),
            extra=["JobSubmitPlugins=lua", "AccountingStorageEnforce=limits,qos"],
        ),
        timeout_s=120,
    )  # fmt: skip
    cluster.run("sacctmgr", "-i", "add", "qos", "gpufleet-theirs", "set", "GrpTRES=gres/gpu=1")
    # acme by user, globex by account: each way of allowing a QOS is used.
    policy = Policy(users={"acme": ("root",)}, accounts={"globex": (ACCOUNT,)}, gpu_tres="cores")
    bridge = Bridge(cluster, policy)
    acme = _booking("rsv_acme", "acme", {"sim-a": 4})
    globex = _booking("rsv_globex", "globex", {"sim-a": 2})
    on_n2 = _booking("rsv_n2", "globex", {"n2": 2})
    ledger = Ledger((acme, globex, on_n2), (), int(time.time() * 1000))

    kinds = await bridge.reconcile(ledger)
    assert kinds == ["qos.create"] * 3 + ["reservation.create"] * 3
    assert await bridge.reconcile(ledger) == []  # in step: Slurm shows what was asked
    qos = (await bridge.state()).qos or {}
    assert qos["gpufleet-rsv_acme"].grp_tres == "gres/gpu:h100=4,gres/gpu=4"
    assert qos["gpufleet-rsv_acme"].users == {"root"}
    assert qos["gpufleet-rsv_globex"].accounts == {ACCOUNT}
    held = cluster.reservations()
    assert held["gpufleet-rsv_acme"]["CoreCnt"] == "8"  # sim-a: 4 GPUs' cores

    in_acme = ("--reservation=gpufleet-rsv_acme",)
    in_globex = ("--reservation=gpufleet-rsv_globex", f"--account={ACCOUNT}")
    acme_job = await _running(cluster, *in_acme, "-w", "sim-a", "--gres=gpu:h100:4")
    assert _job(cluster, acme_job)["qos"] == "gpufleet-rsv_acme"
    globex_job = await _running(cluster, *in_globex, "-w", "sim-a", "--gres=gpu:h100:2")
    assert _job(cluster, globex_job)["qos"] == "gpufleet-rsv_globex"
    # Outside: the two unbooked GPUs of sim-a, not a third.
    assert _gpus(cluster, "-w", "sim-a", "--gres=gpu:h100:3") is None
    outside = _gpus(cluster, "-w", "sim-a", "--gres=gpu:h100:2")
    assert outside is not None and len(outside) == 2, outside
    # More than booked on sim-a: no cores for it, refused.
    assert _gpus(cluster, *in_acme, "-w", "sim-a", "--gres=gpu:h100:5") is None
    # n2 is reserved whole and has 8 free GPUs: the booking's QOS alone holds its jobs
    # to the 2 booked.
    in_n2 = ("--reservation=gpufleet-rsv_n2", f"--account={ACCOUNT}")
    too_many = _submit(cluster, *in_n2, "-w", "n2", "--gres=gpu:h100:3")
    assert too_many is not None

    async def held_by_qos() -> bool:
        return _job(cluster, too_many).get("reason", "").startswith("QOSGrp")

    await eventually(held_by_qos, within_s=WITHIN_S)
    assert _job(cluster, too_many)["state"] == "PENDING"
    cluster.run("scancel", too_many)
    n2_job = await _running(cluster, *in_n2, "-w", "n2", "--gres=gpu:h100:2")
    assert _job(cluster, n2_job)["qos"] == "gpufleet-rsv_n2"

    # acme releases while its job runs: the reservation ends (and the job with it),
    # its QOS goes; globex's and the hand-made one stay.
    released = Ledger((_booking("rsv_acme", "acme", {"sim-a": 4}, "released"), globex, on_n2),
                      (), int(time.time() * 1000))  # fmt: skip
    assert await bridge.reconcile(released) == ["reservation.delete", "qos.delete"]

    async def acme_gone() -> bool:
        return not _job(cluster, acme_job) and "gpufleet-rsv_acme" not in cluster.reservations()

    await eventually(acme_gone, within_s=WITHIN_S)
    left = set((await bridge.state()).qos or {})
    assert "gpufleet-rsv_acme" not in left
    assert {"gpufleet-rsv_globex", "gpufleet-theirs", "normal"} <= left
    # A bridge started afresh (after kill -9) reads the same and plans nothing.
    again = Bridge(cluster, policy)
    assert await again.reconcile(released) == []

    # A tenant mapped to a user slurmdbd does not know: allowing its QOS fails, saying
    # why (the daemon counts and logs it each pass); once the booking goes, so does the QOS.
    ghost = Bridge(cluster, replace(policy, users={"acme": ("root",), "initech": ("ghost",)}))
    haunted = replace(released, reservations=(
        *released.reservations, _booking("rsv_ghost", "initech", {"n2": 1}),
    ))  # fmt: skip
    with pytest.raises(SlurmError, match="no association in slurmdbd"):
        await ghost.reconcile(haunted)
    assert await ghost.reconcile(released) == ["qos.delete"]

    # The daemon: `cores+qos` while sacctmgr answers; slurmdbd gone, it says so, plans
    # no QOS (deletes none) and is no longer in step; the QOS stay in the database.
    # Each pass reads the QOS and their associations with one sacctmgr (its runs logged).
    runs = cluster.root / "sacctmgr.log"
    logged = cluster.root / "sacctmgr-logged"
    logged.write_text(f'#!/bin/sh\necho "$*" >> {runs}\nexec {tool_path("sacctmgr")} "$@"\n')
    logged.chmod(0o755)
    daemon = SlurmBridge(BridgeSettings(
        coordinator_key="unused", slurm_conf=str(cluster.conf_path), gpu_tres="cores",
        scontrol_timeout_s=30, sacctmgr=str(logged),
    ))  # fmt: skip
    state, in_step = await daemon.with_qos(await daemon.scontrol.state())
    assert in_step and state.qos is not None and "gpufleet-rsv_globex" in state.qos
    assert state.qos["gpufleet-rsv_globex"].accounts == {ACCOUNT}  # the associations too
    assert runs.read_text().splitlines() == ["-n -P"]
    assert 'gpufleet_slurm_bridge_mechanism{mechanism="cores+qos"} 1.0' in _metrics(daemon)
    cluster.stop_slurmdbd()
    state, in_step = await daemon.with_qos(await daemon.scontrol.state())
    assert not in_step and state.qos is None
    assert len(runs.read_text().splitlines()) == 2
    assert 'gpufleet_slurm_bridge_mechanism{mechanism="cores"} 1.0' in _metrics(daemon)
    assert 'gpufleet_slurm_bridge_failures_total{kind="qos.read"} 1.0' in _metrics(daemon)
