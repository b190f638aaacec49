"""The fleet as a scrape sees it: pools, their rollup rows, every node and every whole GPU
with its state and current holder. Read in one go by the ledger, rendered by the metrics.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from coordinator.domain.consumption import Consumption
from coordinator.domain.model import AtomView, NodeState, Pool, RollupRow
from coordinator.domain.states import atom_bucket
from shared.wire import HealthStatus

# What a whole GPU is doing now: its rollup bucket, with allocatable split by whether a
# booking holds it at this instant.
GPU_STATES: tuple[str, ...] = (
    "allocated",
    "available",
    "provisioning",
    "unhealthy",
    "maintenance",
    "unreachable",
)


def gpu_state(node: NodeState, health: HealthStatus, held: bool) -> str:
    bucket = atom_bucket(node, AtomView("", "", "gpu", "", health))
    if bucket != "allocatable":
        return bucket
    return "allocated" if held else "available"


@dataclass(frozen=True, slots=True)
class Holder:
    reservation_id: str
    tenant_id: str


@dataclass(frozen=True, slots=True)
class GpuLine:
    """One whole GPU: its NVML UUID (dcgm-exporter's `UUID`) and the node's hostname."""

    uuid: str
    hostname: str
    node_id: str
    pool_id: str
    state: str
    holder: Holder | None = None


@dataclass(frozen=True, slots=True)
class NodeLine:
    node_id: str
    hostname: str
    pool_id: str
    status: str


@dataclass(frozen=True, slots=True)
class Census:
    pools: tuple[Pool, ...] = ()
    rollup: dict[str, list[RollupRow]] = field(default_factory=dict)
    nodes: tuple[NodeLine, ...] = ()
    gpus: tuple[GpuLine, ...] = ()
    # Memory reserved against used in the last complete 15-minute interval (chargeback).
    memory: tuple[Consumption, ...] = ()
