"""The agent's one exception root, and the one place where an error that ends a
`gpufleet-agent` command becomes a line on stderr and an exit status (`exit_status`),
for the daemon and the one-shot commands alike, as coordinator/domain/errors.py is for the
coordinator's API.

Every exception the agent declares derives from `AgentError` (tests/unit/
agent/test_errors.py). Those that end a command carry the status it exits with:

- 2: what restarting cannot fix (bad configuration, no NVML binding, an unknown
  simulated profile, a bad fault file, a missing or bad bookings state file, or one
  that names another node); the systemd unit's RestartPreventExitStatus=2 relies on
  it. The settings framework's `ConfigError` (flags, environment, TOML; the credentials
  file) maps to 2 here too.
- 3: `gpufleet-agent env` asked about a reservation not live on this node (`NotLive`),
  or read bookings the agent has not confirmed lately (`StaleStateFile`).

A background task that dies ends the daemon with 1; that is the supervisor's
(agent/main.py), since no exception reaches `main` then.
"""

from __future__ import annotations

import sys
from typing import ClassVar, TextIO

from procs.settings import ConfigError

__all__ = ["CONFIG", "NOT_LIVE", "AgentError", "NotLive", "exit_status"]

CONFIG = 2  # what a restart cannot fix
NOT_LIVE = 3


class AgentError(Exception):
    """Raised by the agent on purpose. `status` is what a command exits with when the
    error reaches it; errors that never leave their module keep the default."""

    status: ClassVar[int] = CONFIG


class NotLive(AgentError, ValueError):
    """`gpufleet-agent env RESERVATION`: not booked here, or not live now."""

    status = NOT_LIVE


def exit_status(
    exc: AgentError | ConfigError, command: str = "", hint: str = "", err: TextIO | None = None
) -> int:
    """Tell the user of `gpufleet-agent [command]` what stopped it; its exit status."""
    where = f"gpufleet-agent {command}".rstrip()
    label = "config error: " if isinstance(exc, ConfigError) else ""
    print(f"{where}: {label}{exc}" + (f"\n{hint}" if hint else ""), file=err or sys.stderr)
    return CONFIG if isinstance(exc, ConfigError) else exc.status
