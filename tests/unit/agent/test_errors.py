"""The agent's one exception root: every exception it declares derives from
`AgentError`, and what ends a command reaches the user as one line and the exit status
the systemd unit and launchers rely on (agent/errors.py)."""

from __future__ import annotations

import importlib
import inspect
import io
import pkgutil

import pytest

import agent
from agent.bookings import BookingsError
from agent.bookings_trust import ForeignStateFile, StaleStateFile
from agent.errors import CONFIG, NOT_LIVE, AgentError, NotLive, exit_status
from agent.nvml import NvmlMissing
from agent.sim.profile import ProfileError
from procs.settings import ConfigError


def _declared() -> list[type[BaseException]]:
    found = []
    for info in pkgutil.walk_packages(agent.__path__, "agent."):
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, BaseException) and cls.__module__ == info.name:
                found.append(cls)
    return found


def test_every_exception_the_agent_declares_derives_from_agent_error() -> None:
    declared = _declared()
    assert len(declared) >= 8
    assert [c.__qualname__ for c in declared if not issubclass(c, AgentError)] == []


@pytest.mark.parametrize(
    ("exc", "command", "status", "line"),
    [
        (ConfigError("pool_id", "required"), "", CONFIG, "gpufleet-agent: config error: "),
        (ProfileError("unknown profile 'x'"), "", CONFIG, "gpufleet-agent: unknown profile"),
        (NvmlMissing("the NVML binding is missing"), "", CONFIG, "gpufleet-agent: the NVML"),
        (BookingsError("no state file"), "bookings", CONFIG, "gpufleet-agent bookings: no"),
        (NotLive("reservation r has no booking"), "env", NOT_LIVE, "gpufleet-agent env: res"),
        (ForeignStateFile("f holds node a's"), "env", CONFIG, "gpufleet-agent env: f holds"),
        (StaleStateFile("last confirmed 9 s ago"), "env", NOT_LIVE, "gpufleet-agent env: last"),
    ],
)
def test_an_error_that_ends_a_command_is_one_line_and_its_status(
    exc: AgentError | ConfigError, command: str, status: int, line: str
) -> None:
    err = io.StringIO()
    assert exit_status(exc, command, err=err) == status
    assert err.getvalue().startswith(line) and err.getvalue().count("\n") == 1


def test_a_hint_follows_the_message() -> None:
    err = io.StringIO()
    assert exit_status(ConfigError("output", "bad"), "inventory", "usage: x", err) == CONFIG
    assert err.getvalue().endswith("\nusage: x\n")
