"""Versioned JSON payloads on the bus: heartbeat, inventory, alert.

Field names on the wire are camelCase. Unknown fields are ignored so that agents and
coordinators can be upgraded one host at a time; `schemaVersion` says which shape the
sender wrote. Everything here is a frozen value; serialise with `to_json`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from shared.ids import NODE_ID_PATTERN, POOL_ID_PATTERN

SCHEMA_VERSION = 1

# Limits the coordinator enforces before parsing; a heartbeat is normally < 1 KiB.
MAX_HEARTBEAT_BYTES = 8 * 1024
MAX_INVENTORY_BYTES = 1024 * 1024

AtomClass = Literal["gpu", "gpu.mig", "gpu.slot", "nic.vf", "disk", "node"]
ATOM_CLASSES: tuple[AtomClass, ...] = ("gpu", "gpu.mig", "gpu.slot", "nic.vf", "disk", "node")
HealthStatus = Literal["healthy", "degraded", "unhealthy", "unmonitored"]
Sharing = Literal["exclusive", "timeslice", "mps"]
AttrValue = str | int | float | bool | None

NodeId = Annotated[str, Field(pattern=NODE_ID_PATTERN, max_length=128)]
PoolId = Annotated[str, Field(pattern=POOL_ID_PATTERN, max_length=57)]


class Wire(BaseModel):
    model_config = ConfigDict(
        extra="ignore",
        frozen=True,
        alias_generator=to_camel,
        populate_by_name=True,
    )

    def to_json(self) -> bytes:
        return self.model_dump_json(by_alias=True).encode()


class DeviceHealth(Wire):
    """Health of one device (GPU uuid, NIC PCI address, disk name) as the agent sees it."""

    device_id: str
    status: HealthStatus
    reasons: tuple[str, ...] = ()


class NodeHealth(Wire):
    status: HealthStatus
    reasons: tuple[str, ...] = ()


class Atom(Wire):
    """One bookable unit. `device_id` names the device whose health moves this atom."""

    atom_id: str = Field(min_length=1, max_length=256)
    cls: AtomClass = Field(alias="class")
    device_id: str = ""
    attrs: dict[str, AttrValue] = Field(default_factory=dict)


class MigInstance(Wire):
    uuid: str
    gpu_instance_id: int
    compute_instance_id: int
    profile: str
    memory_mib: int


class GpuInfo(Wire):
    uuid: str
    index: int
    name: str
    memory_mib: int
    pci_bus_id: str
    numa_node: int | None = None
    cpu_affinity: str | None = None
    compute_capability: str | None = None
    mig_enabled: bool = False
    mig_instances: tuple[MigInstance, ...] = ()
    nvlink_peers: tuple[str, ...] = ()
    nvlink_clique: str | None = None
    fabric_clique: str | None = None
    sharing: Sharing = "exclusive"
    replicas: int = 1
    missing: str | None = None  # why NVML cannot read it: the GPU is held unhealthy


class NicInfo(Wire):
    name: str
    pci_address: str | None = None
    speed_mbps: int | None = None
    sriov_total_vfs: int = 0
    sriov_num_vfs: int = 0
    vfs: tuple[str, ...] = ()
    bookable: bool = True  # the management NIC is not, unless configured to be


class DiskInfo(Wire):
    name: str
    size_bytes: int
    rotational: bool = False
    model: str | None = None
    device_id: str = ""  # WWN, serial or PCI path: stable across reboots, unlike `name`
    bookable: bool = True  # the boot/root disk is not, unless configured to be


class Scalars(Wire):
    vcpu: int = Field(default=0, ge=0)
    memory_gib: int = Field(default=0, ge=0, alias="memoryGiB")
    hugepages_1gi: int = Field(default=0, ge=0, alias="hugepages1Gi")


class Inventory(Wire):
    """The full picture of one host, published at start, on change and on request."""

    schema_version: int = SCHEMA_VERSION
    node_id: NodeId
    pool_id: PoolId
    boot_id: str
    sent_at: int
    inventory_hash: str
    hostname: str = ""
    agent_version: str = ""
    driver_version: str | None = None
    cuda_version: str | None = None
    profile_id: str | None = None
    profile_version: int | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    provisioning: bool = False
    gpus: tuple[GpuInfo, ...] = ()
    nics: tuple[NicInfo, ...] = ()
    disks: tuple[DiskInfo, ...] = ()
    scalars: Scalars = Field(default_factory=Scalars)
    atoms: tuple[Atom, ...] = ()
    health: NodeHealth = NodeHealth(status="healthy")
    devices: tuple[DeviceHealth, ...] = ()

    @model_validator(mode="after")
    def _unique_atom_ids(self) -> Inventory:
        seen: set[str] = set()
        repeated: set[str] = set()
        for atom in self.atoms:
            (repeated if atom.atom_id in seen else seen).add(atom.atom_id)
        dupes = sorted(repeated)
        if dupes:
            shown = ", ".join(dupes[:5]) + (f" and {len(dupes) - 5} more" if len(dupes) > 5 else "")
            raise ValueError(f"duplicate atom ids: {shown}")
        return self


class Heartbeat(Wire):
    """Small and frequent. `devices` lists every device that is not healthy right now
    (absent means healthy), so a lost heartbeat never loses a health change."""

    schema_version: int = SCHEMA_VERSION
    node_id: NodeId
    pool_id: PoolId
    boot_id: str
    seq: int = Field(ge=0)
    sent_at: int
    interval_ms: int = Field(ge=100, le=3_600_000)
    inventory_hash: str
    provisioning: bool = False
    health: NodeHealth
    devices: tuple[DeviceHealth, ...] = ()


# Every kind of alert, the one list (SPEC §4): every transition the ledger records is
# one of these, and `coordinator.services.alerting` decides which are published (all).
# The SPEC's kinds, plus the ends of the one-sided flags it names (`node.provisioned`,
# `node.maintenanceEnded`), a node's first inventory (`node.registered`) and a device
# that turned `degraded` (a warning, like `node.degraded`).
AlertKind = Literal[
    "node.registered",
    "node.unreachable",
    "node.reachable",
    "node.unhealthy",
    "node.healthy",
    "node.degraded",
    "node.unmonitored",
    "node.provisioning",
    "node.provisioned",
    "node.maintenance",
    "node.maintenanceEnded",
    "node.duplicateId",
    "node.poolChangePending",
    "node.poolChanged",
    "device.unhealthy",
    "device.healthy",
    "device.degraded",
    "device.reconfigured",
    "device.missing",
    "reservation.notice",
    "reservation.atRisk",
    "reservation.recovered",
]
ALERT_KINDS: tuple[AlertKind, ...] = get_args(AlertKind)


class Alert(Wire):
    schema_version: int = SCHEMA_VERSION
    alert_id: str
    kind: AlertKind
    pool_id: str
    node_id: str
    at: int
    reason: str = ""
    since: int | None = None
    by: str = "coordinator"
    device_id: str | None = None
    reservation_id: str | None = None
    details: dict[str, Any] = Field(default_factory=dict)
