"""What each node's GPUs run now, as its agent last told us (SPEC §10), pure and in memory.

An agent numbers the states of its use (`use_version`, per boot) and sends changes:
a heartbeat's `use` holds the whole current state of every device whose use changed
since version `use_base`, and applying it on top of that version gives `use_version`.
A full `UseReport` replaces everything. A receiver that holds another version (or none,
or another boot's) cannot apply a delta: it asks the agent for a full report. A
heartbeat without use (`use_version` 0: an agent that does not report use) costs one
comparison and changes nothing.

Use is bounded by the inventory: a node's use is kept only for the units (GPU and MIG
instance UUIDs) its recorded inventory has (`units`, `inventory_units`); a device any
other id names is dropped and counted, so nothing a host sends grows the book, the
ledger or the metrics past what its inventory allows. A node whose units change keeps
only the devices it still has.

Owners' host memory (`OwnerMemory`, issue 35) is part of the same versioned state, keyed
by owner (an entry of 0 MiB removes one), bounded by the wire (`MAX_OWNER_MEMORY` in a
report; a node holds no more than that many). Each entry's peak is kept apart until the
leader's pass takes it (`take_memory`): a peak counts at one pass, not at every pass
until the owner's memory next changes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import msgspec

from coordinator.domain.gpu_use_units import GPU_CLASSES, unit_of
from shared.wire import MAX_OWNER_MEMORY, DeviceUse, Heartbeat, Inventory, OwnerMemory, UseReport

# An atom as `atom_units` reads it: (class, atom id, device id, attributes).
AtomRow = tuple[str, str, str, Mapping[str, Any]]
OwnerKey = tuple[str, str]  # (owner kind, owner)


class Applied(Enum):
    """What a heartbeat's use did to the book."""

    NONE = "none"  # no use in it, or the version we hold already
    APPLIED = "applied"
    NEEDS_REPORT = "needs_report"  # we hold another version: ask for a full report


@dataclass(slots=True)
class NodeUse:
    """One node's current use: its devices by UUID (GPU or MIG instance)."""

    node_id: str
    pool_id: str
    boot_id: str
    version: int
    updated_at: int  # the coordinator's clock when the last change or report arrived
    devices: dict[str, DeviceUse] = field(default_factory=dict)
    memory: dict[OwnerKey, OwnerMemory] = field(default_factory=dict)
    peaks: dict[OwnerKey, int] = field(default_factory=dict)  # since the last pass took them

    def apply_memory(self, entries: Iterable[OwnerMemory]) -> None:
        for entry in entries:
            key = (entry.owner_kind, entry.owner)
            if not (entry.current_mib or entry.peak_mib):
                self.memory.pop(key, None)
                continue
            if key not in self.memory and len(self.memory) >= MAX_OWNER_MEMORY:
                continue  # past the wire's bound: a sender that breaks it gets no more
            self.memory[key] = entry
            self.peaks[key] = max(self.peaks.get(key, 0), entry.peak_mib)
        self.peaks = {k: v for k, v in self.peaks.items() if k in self.memory}

    def take_memory(self) -> list[OwnerMemory]:
        """The owners' memory now, each with the most it held since the last take."""
        out = [
            msgspec.structs.replace(
                m, peak_mib=max(m.current_mib, self.peaks.get(key, m.current_mib))
            )
            for key, m in self.memory.items()
        ]
        self.peaks = {}
        return out


def atom_units(atoms: Iterable[AtomRow]) -> frozenset[str]:
    """The units GPU-carrying atoms stand for: each GPU's UUID (a MIG instance's atom
    names its GPU as its device: the agent reports the GPU's memory there) and each MIG
    instance's own."""
    out: set[str] = set()
    for cls, atom_id, device_id, attrs in atoms:
        if cls not in GPU_CLASSES:
            continue
        if device_id:
            out.add(device_id)
        out.add(unit_of(cls, atom_id, device_id, attrs))
    return frozenset(out)


def inventory_units(inv: Inventory) -> frozenset[str]:
    """The units a node's inventory has: its GPUs' and MIG instances' UUIDs."""
    gpus = {g.uuid for g in inv.gpus} | {m.uuid for g in inv.gpus for m in g.mig_instances}
    return atom_units((a.cls, a.atom_id, a.device_id, a.attrs) for a in inv.atoms) | gpus


@dataclass(slots=True)
class GpuUseBook:
    nodes: dict[str, NodeUse] = field(default_factory=dict)
    # Node → the units its recorded inventory has; use of any other device is dropped.
    units: dict[str, frozenset[str]] = field(default_factory=dict)
    # Reports and deltas applied, and deltas that could not be (counted for metrics).
    reports: int = 0
    deltas: int = 0
    mismatches: int = 0
    # Device entries dropped because the node's inventory has no such unit.
    unknown_devices: int = 0

    def _known(self, node_id: str, devices: Iterable[DeviceUse]) -> tuple[list[DeviceUse], int]:
        """The devices the node's inventory has, and how many others were named."""
        allowed = self.units.get(node_id, frozenset())
        kept: list[DeviceUse] = []
        unknown = 0
        for d in devices:
            if d.device_id in allowed:
                kept.append(d)
            else:
                unknown += 1
        self.unknown_devices += unknown
        return kept, unknown

    def set_units(self, node_id: str, units: frozenset[str]) -> bool:
        """The node's inventory as recorded now; True when its units changed (the use
        held of a unit it no longer has is dropped)."""
        if self.units.get(node_id) == units:
            return False
        self.units[node_id] = units
        held = self.nodes.get(node_id)
        if held is not None:
            held.devices = {k: d for k, d in held.devices.items() if k in units}
        return True

    def on_heartbeat(self, hb: Heartbeat, now: int) -> tuple[Applied, int]:
        """What the heartbeat's use did, and how many of its devices the node's
        inventory does not have (dropped)."""
        if hb.use_version == 0:
            return Applied.NONE, 0
        held = self.nodes.get(hb.node_id)
        if held is not None and held.boot_id == hb.boot_id:
            if hb.use_version == held.version:
                held.updated_at = now
                return Applied.NONE, 0
            if hb.use_base == held.version and hb.use_version > held.version:
                kept, unknown = self._known(hb.node_id, hb.use)
                for device in kept:
                    held.devices[device.device_id] = device
                held.apply_memory(hb.memory)
                held.version = hb.use_version
                held.pool_id = hb.pool_id
                held.updated_at = now
                self.deltas += 1
                return Applied.APPLIED, unknown
        self.mismatches += 1
        return Applied.NEEDS_REPORT, 0

    def on_report(self, report: UseReport, now: int) -> int:
        """Apply a full report; how many of its devices the node's inventory does not
        have (dropped)."""
        held = self.nodes.get(report.node_id)
        same_boot = held is not None and held.boot_id == report.boot_id
        if same_boot and held is not None and held.version > report.use_version:
            return 0  # an older report overtaken by deltas already applied
        kept, unknown = self._known(report.node_id, report.devices)
        node = NodeUse(
            node_id=report.node_id,
            pool_id=report.pool_id,
            boot_id=report.boot_id,
            version=report.use_version,
            updated_at=now,
            devices={d.device_id: d for d in kept},
        )
        if same_boot and held is not None:
            node.peaks = held.peaks  # not yet taken: still the pass's to count
        node.apply_memory(report.memory)
        self.nodes[report.node_id] = node
        self.reports += 1
        return unknown

    def forget(self, node_id: str) -> None:
        self.nodes.pop(node_id, None)
        self.units.pop(node_id, None)

    def __iter__(self) -> Iterator[NodeUse]:
        return iter(self.nodes.values())
