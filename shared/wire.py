"""Versioned JSON payloads on the bus: heartbeat, inventory, alert.

Field names on the wire are camelCase. Unknown fields are ignored so that agents and
coordinators can be upgraded one host at a time; `schemaVersion` says which shape the
sender wrote. Everything here is a frozen value; serialise with `to_json`.

Every field is bounded, because an agent is not trusted to be well behaved: strings are
no longer than their ledger columns and hold no NUL (PostgreSQL refuses it), numbers are
in range for their columns, lists and maps have a most-items count, atom ids are
unique and owned by the sending node (`<nodeId>:…`). A value outside the bounds is a
schema error, dropped and counted at ingest, before it can reach the ledger.
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
_NO_NUL = r"^[^\x00]*$"


def _text(max_length: int) -> Any:
    return Field(max_length=max_length, pattern=_NO_NUL)


# Lengths are the ledger's columns (coordinator/ledger/schema.py) or, for what is only
# kept in the inventory document, generous but finite.
Text64 = Annotated[str, _text(64)]
Text128 = Annotated[str, _text(128)]
Text256 = Annotated[str, _text(256)]
Reason = Annotated[str, _text(1024)]
Reasons = Annotated[tuple[Reason, ...], Field(max_length=64)]
MAX_INT = 2**53  # exact in every JSON reader
Count = Annotated[int, Field(ge=0, le=MAX_INT)]
Int63 = Annotated[int, Field(ge=0, le=2**63 - 1)]
Int32 = Annotated[int, Field(ge=0, le=2**31 - 1)]
AttrValue = (
    Annotated[str, _text(1024)]
    | Annotated[int, Field(ge=-MAX_INT, le=MAX_INT)]
    | Annotated[float, Field(allow_inf_nan=False)]
    | bool
    | None
)
Attrs = Annotated[dict[Text128, AttrValue], Field(max_length=128)]
MAX_DEVICES = 4096
MAX_ATOMS = 16384

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

    device_id: Text128
    status: HealthStatus
    reasons: Reasons = ()


class NodeHealth(Wire):
    status: HealthStatus
    reasons: Reasons = ()


class Atom(Wire):
    """One bookable unit. `device_id` names the device whose health moves this atom."""

    atom_id: str = Field(min_length=1, max_length=256, pattern=_NO_NUL)
    cls: AtomClass = Field(alias="class")
    device_id: Text128 = ""
    attrs: Attrs = Field(default_factory=dict)


class MigInstance(Wire):
    uuid: Text128
    gpu_instance_id: Count
    compute_instance_id: Count
    profile: Text128
    memory_mib: Count


class GpuInfo(Wire):
    uuid: Text128
    index: Count
    name: Text256
    memory_mib: Count
    pci_bus_id: Text64
    # -1 where the kernel does not know (sysfs says so).
    numa_node: Annotated[int, Field(ge=-1, le=MAX_INT)] | None = None
    cpu_affinity: Annotated[str, _text(4096)] | None = None
    compute_capability: Text64 | None = None
    mig_enabled: bool = False
    mig_instances: Annotated[tuple[MigInstance, ...], Field(max_length=64)] = ()
    nvlink_peers: Annotated[tuple[Text128, ...], Field(max_length=MAX_DEVICES)] = ()
    nvlink_clique: Text128 | None = None
    fabric_clique: Text128 | None = None
    sharing: Sharing = "exclusive"
    replicas: Annotated[int, Field(ge=1, le=1024)] = 1
    missing: Reason | None = None  # why NVML cannot read it: the GPU is held unhealthy


class NicInfo(Wire):
    name: Text128
    pci_address: Text64 | None = None
    speed_mbps: Count | None = None
    sriov_total_vfs: Count = 0
    sriov_num_vfs: Count = 0
    vfs: Annotated[tuple[Text128, ...], Field(max_length=MAX_DEVICES)] = ()
    bookable: bool = True  # the management NIC is not, unless configured to be


class DiskInfo(Wire):
    name: Text128
    size_bytes: Count
    rotational: bool = False
    model: Text256 | None = None
    device_id: Text128 = ""  # WWN, serial or PCI path: stable across reboots, unlike `name`
    bookable: bool = True  # the boot/root disk is not, unless configured to be


class Scalars(Wire):
    # The ledger keeps these in 32-bit integer columns; real hosts are far below.
    vcpu: int = Field(default=0, ge=0, le=1 << 20)
    memory_gib: int = Field(default=0, ge=0, le=1 << 30, alias="memoryGiB")
    hugepages_1gi: int = Field(default=0, ge=0, le=1 << 30, alias="hugepages1Gi")


class Inventory(Wire):
    """The full picture of one host, published at start, on change and on request."""

    schema_version: Int32 = SCHEMA_VERSION
    node_id: NodeId
    pool_id: PoolId
    boot_id: Text64
    sent_at: Int63
    inventory_hash: Text128
    hostname: Text256 = ""
    agent_version: Text128 = ""
    driver_version: Text64 | None = None
    cuda_version: Text64 | None = None
    profile_id: Text128 | None = None
    profile_version: Annotated[int, Field(ge=1, le=2**31 - 1)] | None = None
    labels: Annotated[dict[Text128, Text256], Field(max_length=128)] = Field(default_factory=dict)
    provisioning: bool = False
    gpus: Annotated[tuple[GpuInfo, ...], Field(max_length=MAX_DEVICES)] = ()
    nics: Annotated[tuple[NicInfo, ...], Field(max_length=MAX_DEVICES)] = ()
    disks: Annotated[tuple[DiskInfo, ...], Field(max_length=MAX_DEVICES)] = ()
    scalars: Scalars = Field(default_factory=Scalars)
    atoms: Annotated[tuple[Atom, ...], Field(max_length=MAX_ATOMS)] = ()
    health: NodeHealth = NodeHealth(status="healthy")
    devices: Annotated[tuple[DeviceHealth, ...], Field(max_length=MAX_DEVICES)] = ()

    @model_validator(mode="after")
    def _unique_owned_atom_ids(self) -> Inventory:
        # Another node's atom id would collide in the ledger (or claim its device).
        own = f"{self.node_id}:"
        foreign = [a.atom_id for a in self.atoms if not a.atom_id.startswith(own)]
        if foreign:
            raise ValueError(f"atom ids must start with {own!r}: {', '.join(foreign[:3])}")
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

    schema_version: Int32 = SCHEMA_VERSION
    node_id: NodeId
    pool_id: PoolId
    boot_id: Text64
    seq: Int63
    sent_at: Int63
    interval_ms: int = Field(ge=100, le=3_600_000)
    inventory_hash: Text128
    provisioning: bool = False
    health: NodeHealth
    devices: Annotated[tuple[DeviceHealth, ...], Field(max_length=MAX_DEVICES)] = ()
    # NATS errors the agent met since it started (publishes refused or failed, permission
    # violations): its link looks healthy while some of what it sends goes nowhere.
    bus_errors: Int63 = 0


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
