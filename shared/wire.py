"""Versioned JSON payloads on the bus: heartbeat, inventory, alert.

Field names on the wire are camelCase. Unknown fields are ignored so that agents and
coordinators can be upgraded one host at a time; `schemaVersion` says which shape the
sender wrote. Everything here is a frozen msgspec Struct, the one model both sides use:
serialise with `to_json`, decode with `from_json` or a `msgspec.json.Decoder` of the
type (ingest's), which checks every bound below.

Every field is bounded, because an agent is not trusted to be well behaved: strings are
no longer than their ledger columns and hold no NUL (PostgreSQL refuses it), numbers are
in range for their columns, lists and maps have a most-items count, atom ids are
unique and owned by the sending node (`<nodeId>:…`). A value outside the bounds is a
schema error, dropped and counted at ingest, before it can reach the ledger.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self, get_args

import msgspec
from msgspec import Meta, Struct, field

from shared.ids import NODE_ID_PATTERN, POOL_ID_PATTERN

SCHEMA_VERSION = 1

# Limits the coordinator enforces before parsing; a heartbeat is normally < 1 KiB.
MAX_HEARTBEAT_BYTES = 8 * 1024
MAX_INVENTORY_BYTES = 1024 * 1024

# A device's atoms, and the node's own atom (its whole-node booking unit).
DeviceClass = Literal["gpu", "gpu.mig", "gpu.slot", "nic.vf", "disk"]
DEVICE_CLASSES: tuple[DeviceClass, ...] = get_args(DeviceClass)
AtomClass = Literal[DeviceClass, "node"]
ATOM_CLASSES: tuple[AtomClass, ...] = get_args(AtomClass)
HealthStatus = Literal["healthy", "degraded", "unhealthy", "unmonitored"]
Sharing = Literal["exclusive", "timeslice", "mps"]


def _whole(pattern: str) -> str:
    """`pattern` (anchored `^…$`, as shared.ids writes it for every reader) anchored at
    the very end: msgspec matches with Python's `re`, whose `$` also matches before a
    final newline, and an id ending in one is not the id it looks like."""
    return pattern.removesuffix("$") + r"\Z"


# PostgreSQL refuses a NUL in text; msgspec matches patterns with `re.search`.
_NO_NUL = r"\A[^\x00]*\Z"


def _text(max_length: int) -> Meta:
    return Meta(max_length=max_length, pattern=_NO_NUL)


# Lengths are the ledger's columns (coordinator/ledger/schema.py) or, for what is only
# kept in the inventory document, generous but finite.
Text64 = Annotated[str, _text(64)]
Text128 = Annotated[str, _text(128)]
Text256 = Annotated[str, _text(256)]
Reason = Annotated[str, _text(1024)]
# A device's own serial-like identity: printable ASCII without blanks, so one device
# cannot read as two.
PhysicalId = Annotated[str, Meta(max_length=128, pattern=r"\A[!-~]*\Z")]
Reasons = Annotated[tuple[Reason, ...], Meta(max_length=64)]
MAX_INT = 2**53  # exact in every JSON reader
Count = Annotated[int, Meta(ge=0, le=MAX_INT)]
Int63 = Annotated[int, Meta(ge=0, le=2**63 - 1)]
Int32 = Annotated[int, Meta(ge=0, le=2**31 - 1)]
# msgspec refuses NaN and infinities in JSON ("Number out of range") on its own.
AttrValue = (
    Annotated[str, _text(1024)]
    | Annotated[int, Meta(ge=-MAX_INT, le=MAX_INT)]
    | float
    | bool
    | None
)
Attrs = Annotated[dict[Text128, AttrValue], Meta(max_length=128)]
MAX_DEVICES = 4096
MAX_ATOMS = 16384
MAX_PROCESSES = 256  # per GPU or MIG instance in a use report

NodeId = Annotated[str, Meta(pattern=_whole(NODE_ID_PATTERN), max_length=128)]
PoolId = Annotated[str, Meta(pattern=_whole(POOL_ID_PATTERN), max_length=57)]


class Wire(Struct, frozen=True, rename="camel"):
    """A payload on the bus. Constructing one checks only `__post_init__`'s rules;
    decoding one checks every bound, and its `msgspec.ValidationError` names the field
    that broke one (`… - at $.devices[3].status`). The coordinator decodes every
    message it receives, so what an agent builds out of bounds is dropped and counted
    there, with that field in the log."""

    def to_json(self) -> bytes:
        return _ENCODER.encode(self)

    @classmethod
    def from_json(cls, data: bytes | str) -> Self:
        """The payload in `data`; raises `msgspec.ValidationError` for a value outside the
        schema, `msgspec.DecodeError` (its base) for what is not JSON."""
        return msgspec.json.decode(data, type=cls)


_ENCODER = msgspec.json.Encoder()


# gc=False on the heartbeat's parts: tens of thousands a second, holding only strings,
# numbers and tuples of each other, never in a cycle; the cyclic GC need not walk them.
class DeviceHealth(Wire, frozen=True, kw_only=True, gc=False):
    """Health of one device (GPU uuid, NIC PCI address, disk name) as the agent sees it."""

    device_id: Text128
    status: HealthStatus
    reasons: Reasons = ()


class NodeHealth(Wire, frozen=True, kw_only=True, gc=False):
    status: HealthStatus
    reasons: Reasons = ()


class Atom(Wire, frozen=True, kw_only=True):
    """One bookable unit. `device_id` names the device whose health moves this atom."""

    atom_id: Annotated[str, Meta(min_length=1, max_length=256, pattern=_NO_NUL)]
    cls: AtomClass = field(name="class")
    device_id: Text128 = ""
    attrs: Attrs = field(default_factory=dict)


class MigInstance(Wire, frozen=True, kw_only=True):
    uuid: Text128
    gpu_instance_id: Count
    compute_instance_id: Count
    profile: Text128
    memory_mib: Count


class GpuInfo(Wire, frozen=True, kw_only=True):
    uuid: Text128
    index: Count
    name: Text256
    memory_mib: Count
    pci_bus_id: Text64
    # -1 where the kernel does not know (sysfs says so).
    numa_node: Annotated[int, Meta(ge=-1, le=MAX_INT)] | None = None
    cpu_affinity: Annotated[str, _text(4096)] | None = None
    compute_capability: Text64 | None = None
    mig_enabled: bool = False
    mig_instances: Annotated[tuple[MigInstance, ...], Meta(max_length=64)] = ()
    nvlink_peers: Annotated[tuple[Text128, ...], Meta(max_length=MAX_DEVICES)] = ()
    nvlink_clique: Text128 | None = None
    fabric_clique: Text128 | None = None
    sharing: Sharing = "exclusive"
    replicas: Annotated[int, Meta(ge=1, le=1024)] = 1
    missing: Reason | None = None  # why NVML cannot read it: the GPU is held unhealthy


class NicInfo(Wire, frozen=True, kw_only=True):
    name: Text128
    pci_address: Text64 | None = None
    speed_mbps: Count | None = None
    sriov_total_vfs: Count = 0
    sriov_num_vfs: Count = 0
    vfs: Annotated[tuple[Text128, ...], Meta(max_length=MAX_DEVICES)] = ()
    # What names the card itself (`guid:<node GUID>`, `mac:<permanent MAC>`,
    # `vpd:<serial>`; agent.nic_identity), compared fleet-wide so one NIC is not offered
    # under two node ids; "" (an older agent, or nothing readable): not compared.
    physical_id: PhysicalId = ""
    bookable: bool = True  # the management NIC is not, unless configured to be


class DiskInfo(Wire, frozen=True, kw_only=True):
    name: Text128
    size_bytes: Count
    rotational: bool = False
    model: Text256 | None = None
    device_id: Text128 = ""  # WWN, serial or PCI path: stable across reboots, unlike `name`
    bookable: bool = True  # the boot/root disk is not, unless configured to be


class Scalars(Wire, frozen=True, kw_only=True):
    # The ledger keeps these in 32-bit integer columns; real hosts are far below.
    vcpu: Annotated[int, Meta(ge=0, le=1 << 20)] = 0
    memory_gib: Annotated[int, Meta(ge=0, le=1 << 30)] = field(default=0, name="memoryGiB")
    hugepages_1gi: Annotated[int, Meta(ge=0, le=1 << 30)] = field(default=0, name="hugepages1Gi")


class CpuTopology(Wire, frozen=True, kw_only=True):
    """The host's CPUs as sysfs lays them out (what `slurmd -C` prints): sockets, cores
    in each, hardware threads per core."""

    sockets: Annotated[int, Meta(ge=1, le=1 << 12)]
    cores_per_socket: Annotated[int, Meta(ge=1, le=1 << 16)]
    threads_per_core: Annotated[int, Meta(ge=1, le=64)]


class Inventory(Wire, frozen=True, kw_only=True):
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
    profile_version: Annotated[int, Meta(ge=1, le=2**31 - 1)] | None = None
    labels: Annotated[dict[Text128, Text256], Meta(max_length=128)] = field(default_factory=dict)
    provisioning: bool = False
    gpus: Annotated[tuple[GpuInfo, ...], Meta(max_length=MAX_DEVICES)] = ()
    nics: Annotated[tuple[NicInfo, ...], Meta(max_length=MAX_DEVICES)] = ()
    disks: Annotated[tuple[DiskInfo, ...], Meta(max_length=MAX_DEVICES)] = ()
    scalars: Scalars = Scalars()
    cpu_topology: CpuTopology | None = None  # None: an agent that does not say
    atoms: Annotated[tuple[Atom, ...], Meta(max_length=MAX_ATOMS)] = ()
    health: NodeHealth = NodeHealth(status="healthy")
    devices: Annotated[tuple[DeviceHealth, ...], Meta(max_length=MAX_DEVICES)] = ()

    def __post_init__(self) -> None:
        # Another node's atom id would collide in the ledger (or claim its device). A
        # ValueError here is a msgspec.ValidationError when decoding.
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


# Who runs a process, from /proc/<pid>: `GPUFLEET_RESERVATION_ID` in its environment,
# else its cgroup (a Kubernetes pod UID, a Slurm job id, a systemd unit, a container id).
OwnerKind = Literal["reservation", "pod", "slurm", "systemd", "container", "unknown"]
OWNER_KINDS: tuple[OwnerKind, ...] = get_args(OwnerKind)
Percent = Annotated[int, Meta(ge=0, le=100)]


# SM utilization (%) under which a GPU counts as idle: the coordinator's default, and
# the agent's, which settles readings so that a crossing of it is always sent.
IDLE_UTIL_PERCENT = 5


class ProcessUse(Wire, frozen=True, kw_only=True, gc=False):
    """One compute process on a GPU or MIG instance."""

    pid: Int32
    used_memory_mib: Count | None = None
    owner: Text256 = ""  # the reservation id, pod UID, job id, unit or container id
    owner_kind: OwnerKind = "unknown"
    sm_util: Percent | None = None  # nvmlDeviceGetProcessUtilization, where supported
    # A readable name for the owner where /proc gives it cheaply ("" otherwise): a pod's
    # `<namespace>/<name>`, a Slurm job's user.
    owner_name: Text256 = ""


class DeviceUse(Wire, frozen=True, kw_only=True, gc=False):
    """What runs on one GPU or MIG instance (`device_id` is its UUID) right now. None
    where NVML cannot say (`NotSupported`, or a MIG instance's utilization).
    `processes_omitted`: how many more processes ran than the list's bound holds (those
    of the unit's own holder are the ones left out first)."""

    device_id: Text128
    sm_util: Percent | None = None
    memory_util: Percent | None = None
    memory_used_mib: Count | None = None
    processes: Annotated[tuple[ProcessUse, ...], Meta(max_length=MAX_PROCESSES)] = ()
    processes_omitted: Count = 0


# Owners whose host memory one use report carries: the distinct owners of the node's GPU
# processes, which `MAX_PROCESSES` per unit already bounds; the agent folds any past
# this into its `unknown` entry, so no memory is left out.
MAX_OWNER_MEMORY = 256


class OwnerMemory(Wire, frozen=True, kw_only=True, gc=False):
    """The host memory one owner's cgroup holds (cgroup v2 `memory.current`), and the
    most it held since the agent last read it (`memory.peak`'s growth, else the larger
    of the two readings): issue 35's memory use. Keyed by (`owner_kind`, `owner`), the
    owner as `ProcessUse` names it; the `unknown` entry (`owner` "") is the memory of
    processes no owner names, and of cgroups two owners share. What the coordinator's
    tenant rules match: the Slurm job's account, the pod's Kubernetes namespace, the
    unix group of the owner's processes ("" where not known). An entry of 0 MiB in a
    heartbeat's changes says the owner is gone."""

    owner_kind: OwnerKind
    owner: Text256 = ""
    current_mib: Count = 0
    peak_mib: Count = 0
    slurm_account: Text128 = ""
    k8s_namespace: Text128 = ""
    unix_group: Text128 = ""


class UseReport(Wire, frozen=True, kw_only=True):
    """The full use of one node (every GPU and MIG instance), on `Subjects.use`: when
    the coordinator asks, and whenever the changes are too large for a heartbeat."""

    schema_version: Int32 = SCHEMA_VERSION
    node_id: NodeId
    pool_id: PoolId
    boot_id: Text64
    sent_at: Int63
    use_version: Int63
    devices: Annotated[tuple[DeviceUse, ...], Meta(max_length=MAX_DEVICES)] = ()
    memory: Annotated[tuple[OwnerMemory, ...], Meta(max_length=MAX_OWNER_MEMORY)] = ()


class BookedDevice(Wire, frozen=True, kw_only=True):
    """One device a booking holds on the node: a GPU or MIG UUID, a NIC VF's PCI address,
    a disk's stable id; `atom_id` is the ledger's atom."""

    atom_id: Annotated[str, Meta(min_length=1, max_length=256, pattern=_NO_NUL)]
    cls: AtomClass = field(name="class")
    device_id: Text128 = ""  # the GPU or MIG UUID (a slot: its GPU's), a disk's id
    pci_address: Text64 | None = None  # NIC VFs


class NodeBooking(Wire, frozen=True, kw_only=True):
    reservation_id: Text128
    tenant_id: Text128
    state: Text64  # shared.reservation_states
    start: Int63
    end: Int63
    devices: Annotated[tuple[BookedDevice, ...], Meta(max_length=MAX_ATOMS)] = ()


# The coordinator sends a node's bookings again, when a heartbeat echoes an etag that
# is not the node's, at most this often; the agent's `env` allows for it in its max age.
BOOKINGS_RESEND_MS = 5000


class NodeBookings(Wire, frozen=True, kw_only=True):
    """Coordinator → agent (`Subjects.bookings`): every live or future booking on the
    node. `etag` changes whenever the list does; the agent echoes it in its heartbeat."""

    schema_version: Int32 = SCHEMA_VERSION
    node_id: NodeId
    etag: Text64
    sent_at: Int63
    bookings: Annotated[tuple[NodeBooking, ...], Meta(max_length=4096)] = ()


class Heartbeat(Wire, frozen=True, kw_only=True, gc=False):
    """Small and frequent. `devices` lists every device that is not healthy right now
    (absent means healthy), so a lost heartbeat never loses a health change."""

    schema_version: Int32 = SCHEMA_VERSION
    node_id: NodeId
    pool_id: PoolId
    boot_id: Text64
    seq: Int63
    sent_at: Int63
    interval_ms: Annotated[int, Meta(ge=100, le=3_600_000)]
    inventory_hash: Text128
    provisioning: bool = False
    health: NodeHealth
    devices: Annotated[tuple[DeviceHealth, ...], Meta(max_length=MAX_DEVICES)] = ()
    # NATS errors the agent met since it started (publishes refused or failed, permission
    # violations): its link looks healthy while some of what it sends goes nowhere.
    bus_errors: Int63 = 0
    # Use (SPEC §10), as changes only: `use` holds the whole current state of each device
    # whose use changed since the heartbeat that carried `use_base`; applied on top of
    # version `use_base` it gives version `use_version`. A receiver that holds another
    # version asks for a full `UseReport` (`Subjects.use_request`). Too many changes for
    # the heartbeat's budget go in a `UseReport` of their own, and the heartbeat then
    # carries only `use_version`.
    use: Annotated[tuple[DeviceUse, ...], Meta(max_length=64)] = ()
    # Owners whose host memory changed, the same way (`OwnerMemory`; 0 MiB: gone).
    memory: Annotated[tuple[OwnerMemory, ...], Meta(max_length=64)] = ()
    use_base: Int63 = 0
    use_version: Int63 = 0
    # The `NodeBookings.etag` the agent last received ("" for none): the coordinator
    # re-sends the node's bookings when it differs from its own, so an agent is current
    # again one heartbeat after any reconnect or restart.
    bookings_etag: Text64 = ""


# Every kind of alert, the one list (SPEC §4): every transition the ledger records is
# one of these, and `coordinator.services.alerting` decides which are published (all).
# The SPEC's kinds, plus the ends of the one-sided flags it names (`node.provisioned`,
# `node.maintenanceEnded`), a node's first inventory (`node.registered`), physical
# devices another node holds (`node.duplicateDevice`, issue 31) and the operator's
# answer (`node.replaced`), and a device
# that turned `degraded` (a warning, like `node.degraded`). Promise against use (SPEC §10):
# `gpu.unbookedUse`, `gpu.foreignUse`, `reservation.idle`, each a condition with its end
# (`gpu.unbookedUseEnded`, `gpu.foreignUseEnded`, `reservation.inUse`).
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
    "node.duplicateDevice",
    "node.replaced",
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
    "gpu.unbookedUse",
    "gpu.foreignUse",
    "reservation.idle",
    "reservation.inUse",
    "gpu.unbookedUseEnded",
    "gpu.foreignUseEnded",
]
ALERT_KINDS: tuple[AlertKind, ...] = get_args(AlertKind)
# The kinds the join of bookings and use produces (`coordinator.domain.gpu_use_join`).
USE_KINDS: tuple[AlertKind, ...] = (
    "gpu.unbookedUse",
    "gpu.foreignUse",
    "reservation.idle",
    "reservation.inUse",
    "gpu.unbookedUseEnded",
    "gpu.foreignUseEnded",
)


class Alert(Wire, frozen=True, kw_only=True):
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
    details: dict[str, Any] = field(default_factory=dict)
