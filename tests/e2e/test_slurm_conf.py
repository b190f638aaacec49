"""`gpufleet slurm conf` accepted by a real Slurm: a coordinator with two simulated agents
(an 8-GPU H100 host in rack r1, an A100 host with two MIG-partitioned GPUs in rack r2),
the command run as an operator would, its gres.conf, node lines and topology.conf given
to Debian's slurmctld and one slurmd per node. Each node registers idle with the gres
the inventory has, and jobs can ask for a GPU model, a MIG profile or a feature."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.fleet_procs import Fleet, wait_for
from tests.slurm_cluster import SlurmCluster, SlurmConfig

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]
BIN = Path(sys.executable).parent
AGENTS = {"h100-a": ("h100-sxm-8", "r1"), "a100-m": ("a100-mig-8", "r2")}


@dataclass(frozen=True)
class Fleetish:
    fleet: Fleet
    pool: str


@pytest.fixture
def fleet(tmp_path: Path, nats_url: str) -> Iterator[Fleetish]:
    procs = Fleet(tmp_path, nats_url)
    try:
        procs.start_coordinator()
        op = procs.operator()
        op.call("tenants.create", {"tenantId": "acme"})
        pool = op.call("pools.create", {"tenantId": "acme", "name": "train"})["poolId"]
        for node, (profile, rack) in AGENTS.items():
            procs.start_agent(node, pool, profile, 1.0, "--label", f"rack={rack}")

        def reported() -> int:
            page = op.call("nodes.inventories", {"poolId": pool})
            return sum(1 for n in page["nodes"] if n["reported"] and n["gpus"])

        wait_for(lambda: reported() == len(AGENTS), timeout=60, what="both inventories")
        yield Fleetish(procs, pool)
    finally:
        procs.close()


def slurm_conf(
    world: Fleetish, *args: str, key: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "GPUFLEET_URL": world.fleet.url,
           "GPUFLEET_KEY": key or world.fleet.operator_key}  # fmt: skip
    done = subprocess.run(
        [str(BIN / "gpufleet"), "slurm", "conf", *args], capture_output=True, text=True,
        timeout=60, env=env, check=False,
    )  # fmt: skip
    assert "Traceback" not in done.stderr, done.stderr
    return done


def test_slurm_accepts_the_generated_conf(
    fleet: Fleetish, slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    out = tmp_path / "etc-slurm"
    dev = str(slurm_cluster.dev_dir)
    done = slurm_conf(fleet, "--pool", "train", "--out", str(out), "--dev-dir", dev)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("wrote gres.conf, gpufleet-nodes.conf, topology.conf to ")
    # Printed, the same text as the files (by pool id as well as by name).
    printed = slurm_conf(fleet, "-p", fleet.pool, "--only", "gres", "--dev-dir", dev)
    assert printed.stdout == (out / "gres.conf").read_text()

    node_lines = [
        line for line in (out / "gpufleet-nodes.conf").read_text().splitlines()
        if line.startswith("NodeName=")
    ]  # fmt: skip
    cluster = slurm_cluster.start(
        SlurmConfig(
            nodes=node_lines,
            gres_conf=(out / "gres.conf").read_text(),
            topology_conf=(out / "topology.conf").read_text(),
        )
    )
    # Registered (start() waits for idle) with the inventory's GPUs and MIG instances.
    h100, a100 = cluster.node("h100-a"), cluster.node("a100-m")
    assert _counts(h100["Gres"]) == {"gpu:h100": 8}
    assert h100["CfgTRES"].startswith("cpu=224,mem=2T,") and h100["RealMemory"] == "2097152"
    assert set(h100["AvailableFeatures"].split(",")) == {"pool-train", "h100", "nvlink8"}
    assert _counts(a100["Gres"]) == {
        "gpu:a100": 6, "gpu:a100_1g.10gb": 9, "gpu:a100_2g.20gb": 1, "gpu:a100_3g.40gb": 1,
    }  # fmt: skip
    # slurmd's own reading of gres.conf: each GPU's cores (its NUMA node's) and links.
    gpu5 = next(g for g in cluster.node_gres("h100-a") if g["File"].endswith("/nvidia5"))
    # Cores are Slurm's core indices: the host is 2 sockets x 56 cores x 2 threads.
    assert (gpu5["Cores"], gpu5["Links"]) == ("56-111", "4,4,4,4,4,-1,4,4")
    assert (h100["Sockets"], h100["CoresPerSocket"], h100["ThreadsPerCore"]) == ("2", "56", "2")
    mig = [g for g in cluster.node_gres("a100-m") if g["Type"] == "a100_3g.40gb"]
    assert len(mig) == 1 and mig[0]["File"].count(",") == 2 and mig[0]["Cores"] == "0-63"
    gres_col = dict(
        line.split(" ", 1) for line in cluster.sinfo("-h", "-N", "-o", "%N %G").splitlines()
    )
    assert _counts(gres_col["h100-a"]) == {"gpu:h100": 8}

    # Jobs find what the conf declares: a MIG profile, a model by feature, a rack's switch.
    mig = cluster.srun("--gres=gpu:a100_1g.10gb:2", "printenv", "SLURMD_NODENAME")
    assert mig.stdout.strip() == "a100-m", mig.stderr
    linked = cluster.srun("--constraint=nvlink8", "--gres=gpu:4", "printenv", "SLURMD_NODENAME")
    assert linked.stdout.strip() == "h100-a", linked.stderr
    switches = cluster.scontrol("show", "topology")
    assert "SwitchName=r1 " in switches and "Nodes=h100-a" in switches
    assert "SwitchName=pool-train " in switches


def _counts(gres: str) -> dict[str, int]:
    """`gpu:h100:8(S:0-223),gpu:…` → {"gpu:h100": 8, …} (socket ranges dropped)."""
    out = {}
    for item in re.sub(r"\([^)]*\)", "", gres).split(","):
        kind, _, n = item.rpartition(":")
        out[kind] = int(n)
    return out


def test_an_unknown_pool_and_a_tenant_key_are_one_line_errors(fleet: Fleetish) -> None:
    missing = slurm_conf(fleet, "--pool", "nope")
    assert missing.returncode == 2 and "no pool named 'nope'" in missing.stderr
    assert missing.stdout == ""
    key = fleet.fleet.operator().call("apiKeys.create", {"tenantId": "acme"})["key"]
    tenant = slurm_conf(fleet, "--pool", fleet.pool, key=key)
    assert tenant.returncode == 1 and "PERMISSION_DENIED" in tenant.stderr
    assert len(tenant.stderr.strip().splitlines()) == 1 and tenant.stdout == ""
