"""Values the placer works on: the request, a snapshot of one pool for one time window
(nodes, atoms and the claims held on their devices), and the placement it returns.
Pure data, no I/O."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Literal, Protocol

from coordinator.domain.claims import Claim, claim_of, conflicts, form_of
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
    """One current atom. `device_id` names the physical device it is a form of; `peers`
    the devices (GPU UUIDs) it shares an NVLink with, None when the inventory gave no
    link matrix. Then its `nvlinkClique` label stands in: the agent derives it from the
    link matrix as a clique (GPUs of one label are pairwise linked), never a connected
    component, so the label says no more than the matrix would."""

    atom_id: str
    cls: str
    healthy: bool
    attrs: dict[str, object]
    device_id: str = ""
    peers: frozenset[str] | None = None
    claim: Claim = field(init=False, compare=False)
    # The `nvlinkClique` label, or None; read once (the placer sorts by it per request).
    clique: str | None = field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "claim", claim_of(self.atom_id, self.cls, self.device_id, self.attrs)
        )
        value = self.attrs.get("nvlinkClique")
        object.__setattr__(self, "clique", str(value) if value not in (None, "") else None)

    def linked(self, other: AtomSlot) -> bool:
        """Do the two GPUs share an NVLink?"""
        if self.peers is not None and other.peers is not None:
            return other.device_id in self.peers
        return self.clique is not None and self.clique == other.clique


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
    # The other nodes that hold physical devices this node shows (`physical_ids`): the
    # placer offers none of its atoms.
    duplicate_of: tuple[str, ...] = ()
    # Device → its current atoms (forms), for finding what a held claim covers.
    by_device: dict[str, tuple[AtomSlot, ...]] = field(init=False, compare=False)
    # Device → its current partition (`form`), named when first asked for.
    _forms: dict[str, str] = field(init=False, compare=False, repr=False)
    # (device, part) of a claim on one device → the current atoms it takes, found when
    # first asked for: the placer asks for the same few claims for every request.
    covering: dict[tuple[str, str | None], tuple[AtomSlot, ...]] = field(
        init=False, compare=False, repr=False
    )

    def __post_init__(self) -> None:
        index: dict[str, list[AtomSlot]] = {}
        for atom in self.atoms:
            if atom.claim.device is not None:
                index.setdefault(atom.claim.device, []).append(atom)
        object.__setattr__(self, "by_device", {d: tuple(a) for d, a in index.items()})
        object.__setattr__(self, "_forms", {})
        object.__setattr__(self, "covering", {})

    def covered(self, claim: Claim) -> tuple[AtomSlot, ...]:
        """The current atoms a held claim takes (all of them for a whole-node claim)."""
        device = claim.device
        if device is None:
            return self.atoms
        key = (device, claim.part)
        found = self.covering.get(key)
        if found is None:
            found = self.covering[key] = tuple(
                a for a in self.by_device.get(device, ()) if conflicts(a.claim, claim)
            )
        return found

    def form(self, device: str) -> str:
        """The device's current partition (`claims.form_of` of its current atoms): a
        digest, computed once per device and node as loaded (nodes are immutable)."""
        found = self._forms.get(device)
        if found is None:
            found = self._forms[device] = form_of(a.atom_id for a in self.by_device.get(device, ()))
        return found

    def healthy(self, classes: AbstractSet[str]) -> int:
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
class HeldClaim:
    """A booking in the window: the atom it names (current or not) and what it claims."""

    atom_id: str
    claim: Claim
    holder: Holder


class NodeOrder(Protocol):
    """Eligible nodes in packing order for one window, from counts kept across requests
    (`free_index`): what the placer would get by counting every node itself."""

    def candidates(
        self,
        key: tuple[frozenset[str], bool, str | None, int | None],
        refusal: Callable[[NodeSlot], str | None],
        held: Mapping[str, tuple[HeldClaim, ...]],
        need: int,
    ) -> tuple[Counter[str], int, Iterator[tuple[int, str, NodeSlot]]]: ...

    def eligible(
        self,
        key: tuple[frozenset[str], bool, str | None, int | None],
        refusal: Callable[[NodeSlot], str | None],
        held: Mapping[str, tuple[HeldClaim, ...]],
    ) -> Iterator[tuple[int, NodeSlot]]: ...


@dataclass(frozen=True, slots=True)
class PoolSnapshot:
    """One pool, seen for the window [start, end)."""

    nodes: tuple[NodeSlot, ...]
    # nodeId → every booking on the node overlapping the window, on current atoms and on
    # atoms that are no longer in the inventory alike.
    held: Mapping[str, tuple[HeldClaim, ...]] = field(default_factory=dict)
    # nodeId → resource → [(amount, holder)] of scalar bookings overlapping the window.
    scalar_holders: dict[str, dict[str, tuple[tuple[int, Holder], ...]]] = field(
        default_factory=dict
    )
    # Pool-wide free quantity per scalar resource at the window's peak, after node-level
    # and pool-level (interval reservation) bookings; absent means unconstrained.
    pool_free: dict[str, int] = field(default_factory=dict)
    # Kept free counts for this window, when the snapshot's source keeps them; without
    # them the placer counts every node.
    order: NodeOrder | None = None


@dataclass(frozen=True, slots=True)
class NodePick:
    node_id: str
    atoms: tuple[AtomSlot, ...]
    resources: tuple[tuple[str, int], ...]
    score: float
    victims: frozenset[str] = frozenset()
    # Atoms it takes whose GPU runs a process no booking covers (unbooked use): taken
    # only when nothing idle fits, and said in the answer (`busy_warnings`).
    busy: tuple[str, ...] = ()


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
    # Why nodes were turned away while placing: reason → how many nodes.
    filtered: Mapping[str, int] = field(default_factory=dict)

    @property
    def chosen(self) -> tuple[NodePick, ...]:
        """What a booking takes: every gang member, or the best single node."""
        return self.candidates if self.gang else self.candidates[:1]

    @property
    def warnings(self) -> tuple[str, ...]:
        """What a booking of `chosen` should be told: each GPU in unbooked use it takes."""
        return tuple(
            f"{atom_id} on node {pick.node_id} runs a process no booking covers"
            " (gpu.unbookedUse); taken because no idle GPU fits the request"
            for pick in self.chosen
            for atom_id in pick.busy
        )
