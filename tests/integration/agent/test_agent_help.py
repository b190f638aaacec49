"""`gpufleet-agent --help` names every subcommand, and each has its own `--help`
(issue 34, N8: `inventory --help` showed the daemon's help, and the list had none), run
in a terminal (a real pty) as an operator runs it, and piped."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.terminal import on_pty

AGENT = Path(sys.executable).parent / "gpufleet-agent"
SUBCOMMANDS = ("inventory", "bookings", "env")


def _in_terminal(*args: str) -> tuple[int, str]:
    """Run the agent with a pty as its stdout and stderr; its exit status and output."""
    code, raw = on_pty([str(AGENT), *args], {**os.environ, "COLUMNS": "100"})
    return code, raw.decode().replace("\r\n", "\n")


def test_the_agents_help_lists_every_subcommand() -> None:
    code, text = _in_terminal("--help")
    assert code == 0, text
    commands = text.split("Commands", 1)[1]
    for name in SUBCOMMANDS:
        assert f"\n    {name} " in commands, text
    assert "--version" in text


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_each_subcommand_has_its_own_help(name: str) -> None:
    code, text = _in_terminal(name, "--help")
    assert code == 0, text
    assert f"gpufleet-agent {name}" in text.splitlines()[0] + text.splitlines()[1], text
    assert "Inventory and health of one GPU host" not in text  # not the daemon's help
    piped = subprocess.run([str(AGENT), name, "-h"], capture_output=True, text=True, timeout=30)
    assert piped.returncode == 0 and piped.stdout.strip() == text.strip(), piped
