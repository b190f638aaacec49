"""What the coordinator's liveness rules need from this agent: an interval it can judge,
and a `bootId` that lines up with the host's kernel boots.

The coordinator judges a node by its announced interval clamped to its `max_interval_s`
(default 300 s): an agent beating more slowly than that cap is silent for longer than
the coordinator's window and stays unreachable for good, so the agent refuses such an
interval at start (`check_interval`, exit code 2).

`bootId` is the kernel's boot id (`proc/sys/kernel/random/boot_id`, under the sysfs
root) followed by `/` and a per-process tag: events of one host boot share the prefix,
so a reboot is told from an agent restart, while each agent process still starts its
own heartbeat `seq` (the coordinator ignores an older `seq` of the same bootId). When
the kernel's boot id cannot be read (no procfs, a container without it) the prefix is
`unknown` and a warning is logged: the bootId is then per process only, as before.
"""

from __future__ import annotations

import logging
import os
import uuid
from pathlib import Path

from procs.settings import ConfigError

log = logging.getLogger(__name__)

# The coordinator's `max_interval_s` default. The agent's `interval_s` setting should be
# bounded by it (`le=MAX_INTERVAL_S`); until then `check_interval` refuses it at start.
MAX_INTERVAL_S = 300.0
BOOT_ID_PATH = "proc/sys/kernel/random/boot_id"


def check_interval(interval_s: float, cap_s: float = MAX_INTERVAL_S) -> None:
    """Refuse an interval the coordinator would clamp: its node would never be reachable."""
    if interval_s > cap_s:
        raise ConfigError(
            "interval_s",
            f"{interval_s:g} s is above the coordinator's {cap_s:g} s cap: the node would "
            "be unreachable for good",
        )


def kernel_boot_id(root: Path) -> str | None:
    """The kernel's boot id (a UUID, new at every boot), or None if unreadable."""
    try:
        text = (root / BOOT_ID_PATH).read_text().strip()
        return str(uuid.UUID(text))
    except (OSError, ValueError) as exc:
        log.warning("kernel boot id unreadable (%s): bootId is per agent process only", exc)
        return None


def agent_boot_id(root: Path) -> str:
    """`<kernel boot id>/<8 hex>`: the host boot, then this agent process."""
    return f"{kernel_boot_id(root) or 'unknown'}/{os.urandom(4).hex()}"
