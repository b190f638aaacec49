"""Values the placer works on: the request, a snapshot of one pool for one time window,
and the placement it returns. Pure data, no I/O."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from coordinator.domain.model import NodeState

Topology = Literal["any", "nvlink-all"]
Binding = Literal["hold", "node"]
SCALARS: tuple[str, ...] = ("vcpu", "memoryGiB", "hugepages1Gi")
SelectorValue = str | int | float | bool


@dataclass(frozen=True, slots=True)
class DeviceRequest:
    cls: str
    count: int
    selector: tuple[tuple[str, tuple[SelectorValue, ...]], ...] = ()
    topology: Topology | None = None
    sharing: str | None = None


@dataclass(frozen=True, slots=True)
class PlacementRequest:
    devices: tuple[DeviceRequest, ...]
    topology: Topology = "any"
    binding: Binding = "hold"
    resources: tuple[tuple[str, int], ...] = ()
    profile_id: str | None = None
    profile_version: int | None = None
    gang_size: int = 1
    gang_key: str | None = None
    spot: bool = False

    @property
    def whole_node(self) -> bool:
        return self.binding == "node" or any(d.cls == "node" for d in self.devices)


@dataclass(frozen=True, slots=True)
class AtomSlot:
    atom_id: str
    cls: str
    healthy: bool
    attrs: dict[str, object]

    @property
    def clique(self) -> str | None:
        value = self.attrs.get("nvlinkClique")
        return str(value) if value not in (None, "") else None


@dataclass(frozen=True, slots=True)
class NodeSlot:
    node_id: str
    state: NodeState
    labels: dict[str, str]
    profile_id: str | None
    profile_version: int | None
    atoms: tuple[AtomSlot, ...]
    capacity: dict[str, int]
    # Healthy atoms per class; computed once when the snapshot cache loads the node.
    healthy_by_class: dict[str, int] | None = None

    def healthy(self, classes: set[str]) -> int:
        if self.healthy_by_class is not None:
            return sum(self.healthy_by_class.get(c, 0) for c in classes)
        return sum(1 for a in self.atoms if a.healthy and a.cls in classes)


def healthy_counts(atoms: tuple[AtomSlot, ...]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for atom in atoms:
        if atom.healthy:
            counts[atom.cls] = counts.get(atom.cls, 0) + 1
    return counts


@dataclass(frozen=True, slots=True)
class Holder:
    """Who holds an atom (or node resources) somewhere in the window."""

    reservation_id: str
    spot: bool


@dataclass(frozen=True, slots=True)
class PoolSnapshot:
    """One pool, seen for the window [start, end)."""

    nodes: tuple[NodeSlot, ...]
    atom_holders: Mapping[str, tuple[Holder, ...]] = field(default_factory=dict)
    # nodeId → resource → [(amount, holder)] of scalar bookings overlapping the window.
    scalar_holders: dict[str, dict[str, tuple[tuple[int, Holder], ...]]] = field(
        default_factory=dict
    )
    # Pool-wide free quantity per scalar resource at the window's peak, after node-level
    # and pool-level (interval reservation) bookings; absent means unconstrained.
    pool_free: dict[str, int] = field(default_factory=dict)
    # nodeId → (atomId, class, healthy) of its atoms held in the window; None means "derive
    # it from atom_holders" (hand-built snapshots in tests).
    held_by_node: Mapping[str, tuple[tuple[str, str, bool], ...]] | None = None


@dataclass(frozen=True, slots=True)
class NodePick:
    node_id: str
    atoms: tuple[AtomSlot, ...]
    resources: tuple[tuple[str, int], ...]
    score: float
    victims: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Shortfall:
    index: int | None
    cls: str | None
    requested: int
    available: int
    reason: str


@dataclass(frozen=True, slots=True)
class Placement:
    """The answer: ranked candidate nodes (a gang's members when gang), or shortfalls."""

    fits: bool
    candidates: tuple[NodePick, ...] = ()
    shortfalls: tuple[Shortfall, ...] = ()
    reason: str | None = None
    victims: frozenset[str] = frozenset()
    gang: bool = False

    @property
    def chosen(self) -> tuple[NodePick, ...]:
        """What a booking takes: every gang member, or the best single node."""
        return self.candidates if self.gang else self.candidates[:1]
