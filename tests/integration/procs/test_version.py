"""`--version` on every installed command, run as an operator runs them (issue 34):
each prints `PROG, version X` with the installed package's version and exits 0."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from procs.version import __version__

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
    assert ran.stdout == f"{argv[0]}, version {__version__}\n"
    assert ran.stderr == ""


def test_the_installed_version_is_the_one_declared_in_code() -> None:
    """pyproject.toml takes the version from `procs.version`, so what pip or uv record
    for the install is what every process says without reading that record."""
    assert metadata.version("gpufleet") == __version__
