"""The values the bridge reasons about: the ledger's reservations and nodes as it reads
them, Slurm's reservations and nodes as `scontrol` shows them, and the actions that
change Slurm. Frozen; times in Slurm's unit (whole seconds since the epoch, UTC)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

# Every Slurm reservation gpufleet owns is named this + the reservation id; nothing else
# in Slurm is ever changed by the bridge but nodes whose drain reason starts with
# DRAIN_PREFIX.
RESERVATION_PREFIX = "gpufleet-"
DRAIN_PREFIX = "gpufleet:"
# A booking's QOS (slurmdbd) is named as its reservation, `gpufleet-<id>`, and carries
# this description: a `gpufleet-` QOS without it is someone else's and never touched.
QOS_DESCRIPTION = "gpufleet booking"

DrainCause = Literal["maintenance", "unhealthy", "unreachable"]
DRAIN_CAUSES: tuple[DrainCause, ...] = ("maintenance", "unhealthy", "unreachable")
# How the planner puts GPUs in a reservation (its input: a mode, never "auto").
# "cores": Slurm before 23.11 — the booked GPUs' cores (`CoreCnt`), on nodes whose
# slurm.conf gives each GPU a socket of its own (`gpufleet slurm conf --socket-per-gpu`);
# with job_submit.lua forcing --gres-flags=enforce-binding a job gets only the GPUs of
# the cores it may use. Other nodes are reserved whole.
GpuTres = Literal["typed", "count", "cores", "off"]
GPU_TRES_MODES: tuple[GpuTres, ...] = ("typed", "count", "cores", "off")
# What an operator sets: "auto" tries "typed" and falls back to "cores" when Slurm
# refuses GRES in reservations (before 23.11, or no AccountingStorageTRES for them).
GpuTresSetting = Literal["auto", "typed", "count", "cores", "off"]
BookingQosSetting = Literal["auto", "off"]
# How bookings are held, as the bridge says at start and in its metric: the reservation
# (`gres` TRES, `cores`, whole `nodes`), and `+qos` where each booking's QOS caps its jobs.
MECHANISMS: tuple[str, ...] = ("gres+qos", "gres", "cores+qos", "cores", "nodes+qos", "nodes")


@dataclass(frozen=True)
class LedgerReservation:
    """A live or scheduled reservation: `gpus` counts its whole-GPU atoms per node,
    `nodes` every node it holds anything on."""

    reservation_id: str
    tenant_id: str
    pool_id: str
    state: str
    start_ms: int
    end_ms: int
    binding: str = "hold"
    nodes: frozenset[str] = frozenset()
    gpus: Mapping[str, int] = field(default_factory=dict)
    mig: Mapping[str, Mapping[str, int]] = field(default_factory=dict)  # node -> profile -> n
    classes: frozenset[str] = frozenset({"gpu"})  # of its atoms
    preempt_at_ms: int | None = None
    lease_expires_at_ms: int | None = None

    @property
    def ends_ms(self) -> int:
        """When it ends unless something changes: a noticed spot reservation at its
        preemption, a leased one when its lease runs out (so a renewal moves Slurm's
        EndTime, and Slurm ends it by itself should the bridge be away then)."""
        ends = [self.end_ms, self.preempt_at_ms, self.lease_expires_at_ms]
        return min(t for t in ends if t is not None)


@dataclass(frozen=True)
class LedgerNode:
    """`unhealthy_gpus`: one text per unhealthy GPU, `GPU<index> <why>` (a node whose
    health is only `degraded` may have some); `reachable_since_ms`: when reachability
    last changed (None: not said)."""

    node_id: str
    pool_id: str
    reachable: bool = True
    health: str = "healthy"
    health_reasons: tuple[str, ...] = ()
    maintenance: bool = False
    maintenance_reason: str = ""
    unhealthy_gpus: tuple[str, ...] = ()
    reachable_since_ms: int | None = None


@dataclass(frozen=True)
class Ledger:
    """What the coordinator said, and when (`at_ms`, the bridge's clock when read)."""

    reservations: tuple[LedgerReservation, ...]
    nodes: tuple[LedgerNode, ...]
    at_ms: int


@dataclass(frozen=True)
class SlurmReservation:
    """`tres` holds only the gres part, normalised (`gres/gpu:h100=4`, comma-joined,
    sorted); Slurm adds cpu counts of its own, which the bridge never sets."""

    name: str
    nodes: frozenset[str]
    start_s: int
    end_s: int
    tres: str = ""
    users: frozenset[str] = frozenset()
    accounts: frozenset[str] = frozenset()
    # Cores reserved per node ("cores" mode; empty: whole nodes or TRES). Slurm shows
    # only their total, which is what is compared (`core_total`).
    cores: tuple[tuple[str, int], ...] = ()
    core_total: int = 0

    @property
    def owned(self) -> bool:
        return self.name.startswith(RESERVATION_PREFIX)


@dataclass(frozen=True)
class SlurmNode:
    name: str
    drained: bool = False
    reason: str = ""
    gpu_types: tuple[str, ...] = ()  # from its Gres, in order (`gpu:h100:8` -> h100)
    # Cores per GPU where slurm.conf gives each whole GPU a socket of its own (Sockets=
    # the GPU count): "cores" mode reserves n GPUs as n times this; 0 otherwise.
    cores_per_gpu: int = 0

    @property
    def drained_by_gpufleet(self) -> bool:
        return self.drained and self.reason.startswith(DRAIN_PREFIX)


@dataclass(frozen=True)
class SlurmQos:
    """A QOS as sacctmgr shows it: `grp_tres` its gres limits, normalised (as a
    reservation's `tres`); `users`/`accounts` those whose associations all allow it
    (a user's every association; an account's own)."""

    name: str
    grp_tres: str = ""
    description: str = QOS_DESCRIPTION
    users: frozenset[str] = frozenset()
    accounts: frozenset[str] = frozenset()

    @property
    def owned(self) -> bool:
        return self.name.startswith(RESERVATION_PREFIX) and self.description == QOS_DESCRIPTION


@dataclass(frozen=True)
class SlurmState:
    """`qos`: the QOS in slurmdbd, lower-cased names as sacctmgr keeps them; None when
    not read (no accounting, or booking QOS off): the planner then plans none."""

    reservations: Mapping[str, SlurmReservation]
    nodes: Mapping[str, SlurmNode]
    qos: Mapping[str, SlurmQos] | None = None


@dataclass(frozen=True)
class CreateReservation:
    want: SlurmReservation
    kind: str = "reservation.create"


@dataclass(frozen=True)
class UpdateReservation:
    want: SlurmReservation
    changed: tuple[str, ...]  # of nodes, start, end, tres, users, accounts
    kind: str = "reservation.update"


@dataclass(frozen=True)
class DeleteReservation:
    name: str
    kind: str = "reservation.delete"


@dataclass(frozen=True)
class EndReservation:
    """Not planned: how the adapter deletes a reservation jobs still run in (its
    EndTime moved to now, which ends those jobs)."""

    name: str
    kind: str = "reservation.delete"


@dataclass(frozen=True)
class Drain:
    node: str
    reason: str
    kind: str = "node.drain"


@dataclass(frozen=True)
class Resume:
    node: str
    kind: str = "node.resume"


@dataclass(frozen=True)
class CreateQos:
    """A booking's QOS, made and allowed to its users and accounts."""

    want: SlurmQos
    kind: str = "qos.create"


@dataclass(frozen=True)
class UpdateQos:
    """`have`: what sacctmgr showed (limits to clear, users and accounts to drop)."""

    want: SlurmQos
    have: SlurmQos
    kind: str = "qos.update"


@dataclass(frozen=True)
class DeleteQos:
    """Slurm drops a deleted QOS from every association that allowed it."""

    name: str
    kind: str = "qos.delete"


ScontrolAction = (
    CreateReservation | UpdateReservation | DeleteReservation | EndReservation | Drain | Resume
)  # fmt: skip
QosAction = CreateQos | UpdateQos | DeleteQos
Action = ScontrolAction | QosAction
ACTION_KINDS: tuple[str, ...] = (
    "reservation.create",
    "reservation.update",
    "reservation.delete",
    "node.drain",
    "node.resume",
    "qos.create",
    "qos.update",
    "qos.delete",
)
