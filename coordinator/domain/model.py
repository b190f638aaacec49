"""Domain values: tenants, pools, nodes, atoms, rollup rows, principals.

These are what the ledger returns and the API renders; they carry no behaviour that
needs I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

from shared.counts import COUNT_COLUMNS
from shared.wire import ATOM_CLASSES, AtomClass, HealthStatus

SCALAR_RESOURCES: tuple[str, ...] = ("vcpu", "memoryGiB", "hugepages1Gi")
# Every resource a rollup row, a quota or a reservation counts: atoms and scalars.
RESOURCES: tuple[str, ...] = tuple(sorted((*ATOM_CLASSES, *SCALAR_RESOURCES)))

# Which column of the capacity rollup a node's (or an atom's) capacity counts in now; not
# to be confused with `gpu_use_report.UseHour`, an hour of GPU use.
RollupBucket = Literal["allocatable", "provisioning", "unhealthy", "maintenance", "unreachable"]
ROLLUP_BUCKETS: tuple[RollupBucket, ...] = get_args(RollupBucket)
# What a GPU unit is now, one word (`gpus.list`): its bucket when out of service, else
# held or free; and what it runs: in use, not, or in use with nobody holding it.
GpuState = Literal["free", "held", "provisioning", "unhealthy", "maintenance", "unreachable"]
UseState = Literal["busy", "idle", "unbooked"]
# One word for a node in listings and metrics: its bucket, with allocatable split into
# degraded (a warning) and ready.
NodeStatus = Literal["ready", "degraded", "provisioning", "unhealthy", "maintenance", "unreachable"]
NODE_STATUSES: tuple[NodeStatus, ...] = get_args(NodeStatus)


@dataclass(frozen=True, slots=True)
class Tenant:
    tenant_id: str
    name: str
    created_at: int


@dataclass(frozen=True, slots=True)
class Project:
    """A tenant's own grouping of reservations; its name is unique within the tenant."""

    project_id: str
    tenant_id: str
    name: str
    created_at: int


@dataclass(frozen=True, slots=True)
class ApiKey:
    """A key as listings show it: never its secret nor its hash."""

    key_id: str
    tenant_id: str
    roles: frozenset[str]
    label: str
    created_at: int
    revoked_at: int | None


@dataclass(frozen=True, slots=True)
class IssuedKey:
    """A new API key: its id, and the full key, shown once and never stored."""

    key_id: str
    key: str


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: the tenant a key belongs to and the roles it carries."""

    key_id: str
    tenant_id: str
    roles: frozenset[str]

    @property
    def is_operator(self) -> bool:
        return "operator" in self.roles

    @property
    def is_observer(self) -> bool:
        """Read-only, every tenant's (the Slurm bridge, dashboards, scrapers)."""
        return "observer" in self.roles

    @property
    def reads_every_tenant(self) -> bool:
        return self.is_operator or self.is_observer


@dataclass(frozen=True, slots=True)
class Pool:
    pool_id: str
    name: str
    owner: str
    gpu_model: str | None
    archived: bool
    created_at: int
    offered_to: frozenset[str] = frozenset()

    def visible_to(self, tenant_id: str) -> bool:
        """Owned, or offered and not archived: the seed's visibility rule."""
        if self.owner == tenant_id:
            return True
        return not self.archived and tenant_id in self.offered_to


@dataclass(frozen=True, slots=True)
class NodeState:
    """The flags a node's state is derived from (SPEC §3)."""

    reachable: bool = True
    health: HealthStatus = "healthy"
    maintenance: bool = False
    provisioning: bool = True


@dataclass(frozen=True, slots=True)
class AtomView:
    atom_id: str
    node_id: str
    cls: AtomClass
    device_id: str
    health: HealthStatus = "healthy"


@dataclass(frozen=True, slots=True)
class NodeView:
    """A node with what the rollup needs: its state, atoms and scalar quantities."""

    node_id: str
    pool_id: str
    state: NodeState
    atoms: tuple[AtomView, ...] = ()
    vcpu: int = 0
    memory_gib: int = 0
    hugepages_1gi: int = 0

    def scalar(self, resource: str) -> int:
        if resource == "vcpu":
            return self.vcpu
        if resource == "memoryGiB":
            return self.memory_gib
        if resource == "hugepages1Gi":
            return self.hugepages_1gi
        raise KeyError(resource)


@dataclass(frozen=True, slots=True)
class RollupRow:
    resource: str
    total: int = 0
    allocatable: int = 0
    allocated: int = 0
    reserved: int = 0
    available: int = 0
    provisioning: int = 0
    unhealthy: int = 0
    maintenance: int = 0
    unreachable: int = 0
    updated_at: int = 0

    def counts(self) -> tuple[int, ...]:
        return tuple(getattr(self, c) for c in COUNT_COLUMNS)


@dataclass(frozen=True, slots=True)
class BookedUnits:
    """Per resource, how many units are booked now (`allocated`) and later (`reserved`)."""

    allocated: dict[str, int] = field(default_factory=dict)
    reserved: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class NodeEvent:
    """One recorded transition of a node (or of one of its devices)."""

    event_id: int
    node_id: str
    pool_id: str
    kind: str
    reason: str
    by: str
    at: int
    device_id: str | None


@dataclass(frozen=True, slots=True)
class NewNodeEvent:
    """A node event the coordinator records itself (its `by`); the ledger numbers it."""

    node_id: str
    pool_id: str
    kind: str
    reason: str
    at: int
    device_id: str | None


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """A node as the API shows it: identity, state flags with reason/since/by, counts."""

    node_id: str
    pool_id: str
    hostname: str
    labels: dict[str, str]
    profile_id: str | None
    profile_version: int | None
    state: NodeState
    reachable_since: int
    health_reasons: tuple[str, ...]
    health_since: int
    maintenance_reason: str
    maintenance_by: str
    maintenance_since: int | None
    last_seen: int
    interval_ms: int
    vcpu: int
    memory_gib: int
    hugepages_1gi: int
    atoms: tuple[AtomRecord, ...] = ()
    # Why the coordinator holds it in provisioning (an expected shape exceeded), or "".
    shape_hold: str = ""
    # Why it is held because another node holds one of its physical devices, or it was
    # replaced (`physical_ids`), or "".
    duplicate_hold: str = ""


@dataclass(frozen=True, slots=True)
class AtomRecord:
    atom_id: str
    cls: str
    device_id: str
    health: str
    health_reasons: tuple[str, ...]
    attrs: dict[str, object]


@dataclass(frozen=True, slots=True)
class Holder:
    """The reservation holding an atom now."""

    reservation_id: str
    tenant_id: str
    project_id: str | None
    until: int


@dataclass(frozen=True, slots=True)
class Quota:
    tenant_id: str
    pool_id: str | None
    resource: str
    limit: int
