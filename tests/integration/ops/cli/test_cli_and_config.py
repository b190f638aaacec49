"""The operator CLI against a running coordinator, and configuration errors that name
the field (real subprocesses)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from coordinator.app import Coordinator
from coordinator.services.node_records import record_inventory
from tests.factories import make_inventory, renamed

BIN = Path(sys.executable).parent


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str


async def gpufleet(coordinator: Coordinator, *args: str) -> Ran:
    """Run the CLI without blocking the loop that serves the coordinator it calls."""
    key = coordinator.settings.bootstrap_operator_key
    assert key
    proc = await asyncio.create_subprocess_exec(
        str(BIN / "gpufleet"), "--url", coordinator.url, *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "GPUFLEET_KEY": key},  # never on a command line: `ps` shows it
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode is not None
    return Ran(proc.returncode, out.decode(), err.decode())


async def test_operator_bootstrap_through_the_cli(coordinator: Coordinator) -> None:
    c = coordinator
    assert (await gpufleet(c, "tenant-create", "acme")).returncode == 0
    assert (await gpufleet(c, "tenant-create", "globex")).returncode == 0
    made = await gpufleet(c, "pool-create", "acme", "east", "--gpu-model", "H100")
    pool = json.loads(made.stdout)["poolId"]
    offered = await gpufleet(c, "pool-offer", "acme", pool, "globex")
    assert json.loads(offered.stdout)["offeredTo"] == ["globex"]
    key = json.loads((await gpufleet(c, "key-create", "globex")).stdout)["key"]
    assert key.startswith("gpf_")
    table = await gpufleet(c, "summary", "globex", "-o", "table")
    assert table.returncode == 0 and "pool east" in table.stdout and "owner=acme" in table.stdout
    # Errors are one line on stderr naming the URL and the code, and a non-zero exit.
    dup = await gpufleet(c, "tenant-create", "acme")
    assert dup.returncode == 1 and len(dup.stderr.strip().splitlines()) == 1
    assert "ALREADY_EXISTS" in dup.stderr and c.url in dup.stderr
    bad = await gpufleet(c, "call", "capacity.summary", "{not json")
    assert bad.returncode != 0 and "not JSON" in bad.stderr


def test_coordinator_configuration_errors_name_the_field(tmp_path: Path) -> None:
    def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / "gpufleet-coordinator"), *args],
            capture_output=True,
            text=True,
            timeout=30,
            env={"PATH": "/usr/bin:/bin"} | (env or {}),
        )

    out = run("--port", "70000")
    assert out.returncode == 2 and "http_port" in out.stderr
    out = run(env={"GPUFLEET_MISSES": "zero"})
    assert out.returncode == 2 and "misses" in out.stderr
    bad = tmp_path / "c.toml"
    bad.write_text("[coordinator]\nsweep_interval_s = -1\n")
    out = run("--config", str(bad))
    assert out.returncode == 2 and "sweep_interval_s" in out.stderr
    bad.write_text("[coordinator]\nnats_urll = 'x'\n")
    out = run("--config", str(bad))
    assert out.returncode == 2 and "nats_urll" in out.stderr
    bad.write_text("not = [toml")
    out = run("--config", str(bad))
    assert out.returncode == 2 and "not valid TOML" in out.stderr
    out = run("--config", str(tmp_path / "missing.toml"))
    assert out.returncode == 2 and "cannot read" in out.stderr


def test_coordinator_takes_every_documented_flag(tmp_path: Path) -> None:
    """`--notice-s` is in docs/api.md; `--help` lists it and the parser accepts it."""
    out = subprocess.run(
        [str(BIN / "gpufleet-coordinator"), "--notice-s", "30", "--port", "-1"],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": "/usr/bin:/bin"},
    )
    # The flag parses; the bad port after it is what stops the process.
    assert out.returncode == 2 and "http_port" in out.stderr and "notice" not in out.stderr


BLOCK_PYNVML = """
import sys

class _NoNvml:
    def find_spec(self, name, path=None, target=None):
        if name == "pynvml":
            raise ModuleNotFoundError("No module named 'pynvml'", name="pynvml")
        return None

sys.meta_path.insert(0, _NoNvml())
"""


def test_agent_without_nvidia_ml_py_exits_two_with_a_message(tmp_path: Path) -> None:
    """A host without the NVML binding gets a message and exit 2 (not restarted by
    systemd), not a traceback: pynvml is imported only after the agent checked for it."""
    (tmp_path / "sitecustomize.py").write_text(BLOCK_PYNVML)
    pool = "pool_01hzx3k6w4q8e8d6d8m3w7y2fh"
    for mode in ([], ["--simulate", "l40s-pcie-4"]):
        out = subprocess.run(
            [str(BIN / "gpufleet-agent"), "--pool-id", pool, "--node-id", "n1", *mode],
            capture_output=True,
            text=True,
            timeout=30,
            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path)},
        )
        assert out.returncode == 2, out.stderr
        assert "nvidia-ml-py" in out.stderr and "Traceback" not in out.stderr


async def test_an_operator_sets_a_shape_and_accepts_a_held_node_through_the_cli(
    coordinator: Coordinator,
) -> None:
    c = coordinator
    await gpufleet(c, "tenant-create", "acme")
    pool = json.loads((await gpufleet(c, "pool-create", "acme", "east")).stdout)["poolId"]
    bad = await gpufleet(c, "expected-shape", "gpu=eight", "--pool", pool)
    assert bad.returncode != 0 and "CLASS=COUNT" in bad.stderr
    said = await gpufleet(c, "expected-shape", "gpu=8", "nic.vf=32", "--pool", pool, "-o", "table")
    assert said.stdout.strip() == f"pool {pool}: expected gpu=8 nic.vf=32", said
    await record_inventory(c.ledger, make_inventory("big", pool, gpus=9), 1)
    held = json.loads((await gpufleet(c, "call", "nodes.get", '{"nodeId": "big"}')).stdout)
    assert held["state"]["provisioning"]["reason"].endswith("gpu 9 > 8")
    accepted = await gpufleet(c, "accept-shape", "big", "-o", "table")
    assert accepted.stdout.strip() == "big accepted → ready", accepted


async def test_an_operator_replaces_a_node_through_the_cli(coordinator: Coordinator) -> None:
    c = coordinator
    await gpufleet(c, "tenant-create", "acme")
    pool = json.loads((await gpufleet(c, "pool-create", "acme", "east")).stdout)["poolId"]
    a = make_inventory("old", pool, gpus=2)
    await record_inventory(c.ledger, a, 1)
    await record_inventory(c.ledger, renamed(a, "new"), 1)

    said = await gpufleet(c, "replace-node", "old", "new", "-o", "table")

    assert said.stdout.strip() == (
        "new replaces old (ready); reservations moved: none; ended: none"
    ), said
    held = json.loads((await gpufleet(c, "call", "nodes.get", '{"nodeId": "old"}')).stdout)
    assert held["state"]["provisioning"]["reason"] == "replaced by node new"
