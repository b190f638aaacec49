"""The daemon's latest inventory on the host (`inventory.json` in `state_dir`), so that
`gpufleet-agent gres-uuids`, which Slurm's TaskProlog runs at every task start, names a
job's GPUs from a file instead of initialising NVML (seconds on a busy 8-GPU host).

`InventoryFile.on_state` takes each poll's state: the inventory, as published
(`shared.wire.Inventory` JSON), is written atomically (agent.bookings.write_atomically,
the bookings file's mode rule) when it changed, and the file's modification time is set
at every poll that read NVML: when the agent last knew it current. While the node is
`unmonitored` (NVML released for a GPU reset or MIG change, or failing) the file is not
confirmed, so it goes stale: the GPUs it lists may not be the host's any more. As for
bookings, it is written only into a directory that exists (systemd's `StateDirectory=`).

`read_inventory` is the reader's side: `None` when there is no file this user may read
(a TaskProlog runs as the job's user, whom the unit's 0750 state directory keeps out
unless the operator lets it in), `InventoryFileError` for one that cannot be read
otherwise or decoded; `HeldInventory.vouch` applies agent.bookings_trust's rules.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import msgspec

from agent.bookings import StateDir, read_stamped, readable_as, write_atomically
from agent.bookings_trust import vouch
from agent.errors import AgentError
from agent.state import AgentState
from procs.log_throttle import LogThrottle
from shared.clock import Clock
from shared.wire import Inventory

log = logging.getLogger(__name__)

FILE_NAME = "inventory.json"
WHAT = "the GPUs"  # as the trust messages name the file's content
_DECODER = msgspec.json.Decoder(Inventory)


class InventoryFileError(AgentError, ValueError):
    """The inventory file exists but cannot be read or does not hold an inventory."""


class InventoryFile:
    def __init__(self, path: Path, clock: Clock) -> None:
        self.path = path
        self.clock = clock
        self._written: Inventory | None = None
        self.writes = 0
        self.failures = 0
        self._throttle = LogThrottle(log)
        self._dir = StateDir("inventory")

    def on_state(self, state: AgentState) -> None:
        if state.health.status == "unmonitored":
            return
        directory = self.path.parent
        if not self._dir.ready(directory):
            return
        try:
            if state.inventory != self._written:
                self._written = None
                write_atomically(self.path, state.inventory.to_json(), readable_as(directory))
                self._written = state.inventory
                self.writes += 1
            ns = self.clock.now_ms() * 1_000_000
            os.utime(self.path, ns=(ns, ns))
        except OSError as exc:
            self.failures += 1
            self._throttle.warning(
                "write", "cannot write the inventory file %s: %s", self.path, exc
            )


@dataclass(frozen=True, slots=True)
class HeldInventory:
    """The file's inventory, and when the agent last confirmed it (ms, this host)."""

    path: Path
    inventory: Inventory
    checked_at: int

    def vouch(self, node_id: str, now_ms: int, max_age_ms: int) -> Inventory:
        """The inventory, if this node's and confirmed within `max_age_ms`; else
        `ForeignStateFile` / `StaleStateFile`."""
        age = max(0, now_ms - self.checked_at)  # a clock stepped back reads as fresh
        hint = "is the agent running, NVML not released? (--nvml reads NVML instead)"
        vouch(self.path, WHAT, self.inventory.node_id, node_id, age, max_age_ms, hint)
        return self.inventory


def read_inventory(path: Path) -> HeldInventory | None:
    try:
        data, checked_at = read_stamped(path)
    except (FileNotFoundError, PermissionError):
        return None
    except OSError as exc:
        raise InventoryFileError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        return HeldInventory(path, _DECODER.decode(data), checked_at)
    except msgspec.DecodeError as exc:
        raise InventoryFileError(f"{path} does not hold an inventory: {exc}") from None
