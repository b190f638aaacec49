"""What each node's GPUs run now, as its agent last told us (SPEC §10), pure and in memory.

An agent numbers the states of its use (`use_version`, per boot) and sends changes:
a heartbeat's `use` holds the whole current state of every device whose use changed
since version `use_base`, and applying it on top of that version gives `use_version`.
A full `UseReport` replaces everything. A receiver that holds another version (or none,
or another boot's) cannot apply a delta: it asks the agent for a full report. A
heartbeat without use (`use_version` 0: an agent that does not report use) costs one
comparison and changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum

from shared.wire import DeviceUse, Heartbeat, UseReport


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


@dataclass(slots=True)
class GpuUseBook:
    nodes: dict[str, NodeUse] = field(default_factory=dict)
    # Reports and deltas applied, and deltas that could not be (counted for metrics).
    reports: int = 0
    deltas: int = 0
    mismatches: int = 0

    def on_heartbeat(self, hb: Heartbeat, now: int) -> Applied:
        if hb.use_version == 0:
            return Applied.NONE
        held = self.nodes.get(hb.node_id)
        if held is not None and held.boot_id == hb.boot_id:
            if hb.use_version == held.version:
                held.updated_at = now
                return Applied.NONE
            if hb.use_base == held.version and hb.use_version > held.version:
                for device in hb.use:
                    held.devices[device.device_id] = device
                held.version = hb.use_version
                held.pool_id = hb.pool_id
                held.updated_at = now
                self.deltas += 1
                return Applied.APPLIED
        self.mismatches += 1
        return Applied.NEEDS_REPORT

    def on_report(self, report: UseReport, now: int) -> None:
        held = self.nodes.get(report.node_id)
        same_boot = held is not None and held.boot_id == report.boot_id
        if same_boot and held is not None and held.version > report.use_version:
            return  # an older report overtaken by deltas already applied
        self.nodes[report.node_id] = NodeUse(
            node_id=report.node_id,
            pool_id=report.pool_id,
            boot_id=report.boot_id,
            version=report.use_version,
            updated_at=now,
            devices={d.device_id: d for d in report.devices},
        )
        self.reports += 1

    def forget(self, node_id: str) -> None:
        self.nodes.pop(node_id, None)

    def __iter__(self) -> Iterator[NodeUse]:
        return iter(self.nodes.values())
