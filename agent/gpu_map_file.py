"""The node's GPU map on the host (`gpus.json` in `runtime_dir`), so that `gpufleet-agent
gres-uuids`, which Slurm's TaskProlog runs as the job's user at every task start, names
a job's GPUs from a file instead of initialising NVML (seconds on a busy 8-GPU host).

The file is public: any user on the host may read it (mode 0644, in the unit's
`RuntimeDirectory=` made 0755), since the job's user must. So it holds only what
`gres-uuids` needs and nothing else of the inventory: the node id and, per GPU, its
index, model name, UUID, MIG mode, whether NVML can read it, and its MIG instances
(profile, instance ids, UUID), `shared.slurm_gres`'s `GresGpu` as JSON. The bookings
stay in the private `state_dir` (agent.bookings).

`GpuMapFile.on_state` takes each poll's state: the map is written atomically
(agent.bookings.write_atomically) when it changed, and the file's modification time is
set at every poll that read NVML: when the agent last knew it current. While the node
is `unmonitored` (NVML released for a GPU reset or MIG change, or failing) the file is
not confirmed, so it goes stale: the GPUs it lists may not be the host's any more. It is
written only into a directory that exists (systemd's `RuntimeDirectory=`, which goes
with the service: a stopped agent leaves no map to trust).

`read_gpu_map` is the reader's side: `None` when there is no file this user may read,
`GpuMapFileError` for one that cannot be read otherwise or decoded; `HeldGpuMap.vouch`
applies agent.bookings_trust's rules.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import msgspec

from agent.bookings import StateDir, read_stamped, write_atomically
from agent.bookings_trust import vouch
from agent.errors import AgentError
from agent.state import AgentState
from procs.log_throttle import LogThrottle
from shared.clock import Clock
from shared.slurm_gres import GresGpu, GresMig
from shared.wire import Inventory

log = logging.getLogger(__name__)

FILE_NAME = "gpus.json"
# Readable by every user on the host (a TaskProlog runs as the job's user), written by
# the agent alone.
PUBLIC_MODE = 0o644
WHAT = "the GPUs"  # as the trust messages name the file's content


class GpuMap(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What `gres-uuids` needs of a node's inventory, and no more."""

    node_id: str
    gpus: tuple[GresGpu, ...]


_DECODER = msgspec.json.Decoder(GpuMap)


def gres_gpus(inv: Inventory) -> tuple[GresGpu, ...]:
    """The inventory's GPUs as shared.slurm_gres takes them."""
    return tuple(
        GresGpu(
            g.index, g.name, uuid=g.uuid, mig_enabled=g.mig_enabled, missing=g.missing is not None,
            migs=tuple(
                GresMig(m.profile, m.gpu_instance_id, m.compute_instance_id, uuid=m.uuid)
                for m in g.mig_instances
            ),
        )
        for g in inv.gpus
    )  # fmt: skip


def gpu_map(inv: Inventory) -> GpuMap:
    return GpuMap(inv.node_id, gres_gpus(inv))


class GpuMapFileError(AgentError, ValueError):
    """The GPU map file exists but cannot be read or does not hold a GPU map."""


class GpuMapFile:
    def __init__(self, path: Path, clock: Clock) -> None:
        self.path = path
        self.clock = clock
        self._written: GpuMap | None = None
        self.writes = 0
        self.failures = 0
        self._throttle = LogThrottle(log)
        self._dir = StateDir("the GPU map")

    def on_state(self, state: AgentState) -> None:
        if state.health.status == "unmonitored":
            return
        if not self._dir.ready(self.path.parent):
            return
        try:
            current = gpu_map(state.inventory)
            if current != self._written:
                self._written = None
                write_atomically(self.path, msgspec.json.encode(current), PUBLIC_MODE)
                self._written = current
                self.writes += 1
            ns = self.clock.now_ms() * 1_000_000
            os.utime(self.path, ns=(ns, ns))
        except OSError as exc:
            self.failures += 1
            self._throttle.warning("write", "cannot write the GPU map file %s: %s", self.path, exc)


class HeldGpuMap(msgspec.Struct, frozen=True):
    """The file's GPU map, and when the agent last confirmed it (ms, this host)."""

    path: Path
    gpu_map: GpuMap
    checked_at: int

    def vouch(self, node_id: str | None, now_ms: int, max_age_ms: int) -> GpuMap:
        """The map, if this node's (`node_id`; None: the host's agent's, whichever
        node id it has) and confirmed within `max_age_ms`; else `ForeignStateFile` /
        `StaleStateFile`."""
        age = max(0, now_ms - self.checked_at)  # a clock stepped back reads as fresh
        hint = "is the agent running, NVML not released? (--nvml reads NVML instead)"
        mine = self.gpu_map.node_id
        vouch(self.path, WHAT, mine, mine if node_id is None else node_id, age, max_age_ms, hint)
        return self.gpu_map


def read_gpu_map(path: Path) -> HeldGpuMap | None:
    try:
        data, checked_at = read_stamped(path)
    except (FileNotFoundError, PermissionError):
        return None
    except OSError as exc:
        raise GpuMapFileError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        return HeldGpuMap(path, _DECODER.decode(data), checked_at)
    except msgspec.DecodeError as exc:
        raise GpuMapFileError(f"{path} does not hold a GPU map: {exc}") from None
