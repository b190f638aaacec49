"""`--version` on every installed command, run as an operator runs them (issue 34):
each prints `PROG, version X` with the installed package's version and exits 0."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
COMMANDS = [
    ["gpufleet"],
    ["gpufleet-agent"],
    ["gpufleet-alerts"],
    ["gpufleet-alerts", "forward"],
    ["gpufleet-slurm-bridge"],
    ["gpufleet-coordinator"],
]


@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
def test_every_command_answers_version(argv: list[str]) -> None:
    ran = subprocess.run(
        [str(BIN / argv[0]), *argv[1:], "--version"],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == f"{argv[0]}, version {metadata.version('gpufleet')}\n"
    assert ran.stderr == ""
