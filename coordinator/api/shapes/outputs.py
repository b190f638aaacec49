"""Output models of the compute methods: what each method answers, declared in the
registry beside the input models. They feed the OpenAPI document's response schemas and
the typed client, and they are the answers: handlers build them and the server dumps
them (`registry.dump`); a test validates real answers against them. The error envelope
is here too: every compute method's 4xx/5xx body."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field

from coordinator.api.shapes.base import ApiOutput, optional
from coordinator.api.shapes.fields import EpochMs, PoolId, ProjectId, TenantId
from coordinator.domain.risk import AtRiskReason
from shared.ids import RESERVATION_ID_PATTERN
from shared.reservation_states import ReservationState
from shared.wire import AtomClass

ReservationId = Annotated[
    str,
    Field(
        max_length=57,
        pattern=RESERVATION_ID_PATTERN,
        description="A reservation's id.",
        examples=["rsv_01hzy3k4m5n6p7q8r9s0t1v2w3"],
    ),
]
Cursor = Annotated[
    str | None,
    Field(
        description="Pass as `cursor` for the next page; null on the last page.",
        examples=[None],
    ),
]


class ErrorBody(ApiOutput):
    code: str = Field(
        description="A stable error code: INVALID_INPUT, UNAUTHENTICATED, PERMISSION_DENIED, "
        "NOT_FOUND, CAPACITY_NOT_AVAILABLE, QUOTA_EXCEEDED, IDEMPOTENCY_KEY_CONFLICT, "
        "ALREADY_EXISTS, PAYLOAD_TOO_LARGE, UNAVAILABLE, INTERNAL.",
        examples=["NOT_FOUND"],
    )
    message: str = Field(description="What went wrong, for a person.", examples=["not found"])
    details: Any = Field(
        description="Structured detail: `fields` (path, message, type) for INVALID_INPUT, "
        "per-device shortfalls for CAPACITY_NOT_AVAILABLE; `{}` when there is none.",
        examples=[{}],
    )


class ErrorEnvelope(ApiOutput):
    """The error envelope every compute method answers a failure with."""

    error: ErrorBody = Field(description="The error.")


# --- capacity -------------------------------------------------------------------------


class RollupRowOut(ApiOutput):
    """One resource's counts in a pool (whole units: GPUs, GiB, vCPUs…)."""

    resource: str = Field(description="The resource (gpu, gpu.mig, vcpu, memoryGiB, …).")
    total: int = Field(description="Every unit the pool's nodes report.")
    allocatable: int = Field(description="Units in the allocatable bucket.")
    allocated: int = Field(description="Allocatable units booked by reservations active now.")
    reserved: int = Field(description="Allocatable units booked by reservations to come.")
    available: int = Field(description="Allocatable units booked by nothing now or later.")
    provisioning: int = Field(description="Units on nodes still provisioning.")
    unhealthy: int = Field(description="Units unhealthy (or unmonitored).")
    maintenance: int = Field(description="Units on nodes in maintenance.")
    unreachable: int = Field(description="Units on nodes not heard from.")
    updated_at: EpochMs = Field(description="When the row last changed.")


class ModelTotals(ApiOutput):
    """Whole GPUs of one GPU model over the listed pools."""

    total: int = Field(description="Every GPU.")
    allocatable: int = Field(description="GPUs in the allocatable bucket.")
    allocated: int = Field(description="GPUs booked now.")
    reserved: int = Field(description="GPUs booked later.")
    available: int = Field(description="GPUs booked by nothing.")


class PoolCapacity(ApiOutput):
    pool_id: PoolId = Field(description="The pool.")
    name: str = Field(description="The pool's name.")
    gpu_model: str | None = Field(description="The pool's GPU model, if set.")
    owner: TenantId = Field(description="The tenant owning the pool.")
    archived: bool = Field(description="Archived pools show only to their owner.")
    capacity: list[RollupRowOut] = Field(description="The pool's rollup rows.")
    unbooked_busy: int | None = optional(
        description="How many of its allocatable GPUs run a process no booking covers"
        " (gpu.unbookedUse, as the leader's use join last saw it): counted in the gpu"
        " row's available, but placed last. Left out when none.",
    )
    gpu_models: dict[str, ModelTotals] | None = optional(
        description="capacity.fleet, a pool that declares no GPU model (byGpuModel counts"
        " it under `other`): its whole GPUs per model its agents report (`other`: none"
        " reported). Left out elsewhere.",
    )


class CapacitySummary(ApiOutput):
    tenant_id: TenantId | None = Field(description="The tenant asked about (null: fleet).")
    pools: list[PoolCapacity] = Field(description="Every pool listed, with its rollup rows.")
    by_gpu_model: dict[str, ModelTotals] = Field(
        description="Whole GPUs per GPU model (`other`: pools without one)."
    )


class PoolRows(ApiOutput):
    pool_id: PoolId = Field(description="The pool.")
    rows: list[RollupRowOut] = Field(description="One row per resource, by resource name.")
    unbooked_busy: int | None = optional(
        description="How many of its allocatable GPUs run a process no booking covers"
        " (gpu.unbookedUse, as the leader's use join last saw it): counted in the gpu"
        " row's available, but placed last. Left out when none.",
    )


class CandidateAtom(ApiOutput):
    """An atom the placer would take, with its attributes (model, memory, …) inline."""

    model_config = ConfigDict(extra="allow")

    atom_id: str = Field(description="The atom's id.")
    cls: AtomClass = Field(alias="class", description="The atom's class.")


class Candidate(ApiOutput):
    node_id: str = Field(description="The node.")
    atoms: list[CandidateAtom] = Field(description="The atoms it would take there.")
    score: float = Field(description="The placer's score (higher is better).")


class DeviceShortfall(ApiOutput):
    index: int | None = Field(description="Which device request (null: the whole request).")
    cls: AtomClass | None = Field(alias="class", description="Its class.")
    requested: int = Field(description="How many were asked for.")
    available: int = Field(description="How many could be had.")
    reason: str = Field(description="Why not more.")


class Preemptible(ApiOutput):
    count: int = Field(description="How many spot reservations would have to give way.")
    starts_at: EpochMs = Field(description="When the request could start after notice.")


class Preview(ApiOutput):
    fits: bool = Field(description="Whether the request would be booked now.")
    candidates: list[Candidate] = Field(description="Up to 10 ranked candidate nodes.")
    reason: str | None = optional(description="Why it does not fit (when not).")
    shortfalls: list[DeviceShortfall] | None = optional(
        description="Per device request, what was asked and had (when not)."
    )
    preemptible: Preemptible | None = optional(
        description="What preempting spot reservations would free."
    )
    filtered: dict[str, int] | None = optional(
        description="When it does not fit: how many nodes the placer turned away, by reason.",
        examples=[{"not allocatable": 1, "at most 2 free matching gpu on one node": 3}],
    )
    warnings: list[str] | None = optional(
        description="What the best candidate would be told: each GPU in unbooked use (a process no"
        " booking covers) it takes, taken only because no idle GPU fits.",
    )


class TimelineBucket(ApiOutput):
    start: EpochMs = Field(description="The bucket's start.")
    end: EpochMs = Field(description="The bucket's end.")
    booked: int = Field(description="Whole GPUs booked at the bucket's busiest instant.")
    free: int = Field(description="Allocatable GPUs not booked then.")


class Timeline(ApiOutput):
    pool_id: PoolId = Field(description="The pool.")
    from_: EpochMs = Field(alias="from", description="The window's start.")
    to: EpochMs = Field(description="The window's end.")
    step_minutes: int = Field(description="Each bucket's length.")
    allocatable: int = Field(description="Allocatable whole GPUs now.")
    buckets: list[TimelineBucket] = Field(description="The buckets, oldest first.")


# --- reservations ---------------------------------------------------------------------


class BookedAtomOut(ApiOutput):
    atom_id: str = Field(description="The atom booked.", examples=["gpu-host-01:gpu:GPU-5e1c"])
    node_id: str = Field(description="Its node.", examples=["gpu-host-01"])
    cls: AtomClass = Field(alias="class", description="Its class.")


class Gang(ApiOutput):
    size: int = Field(description="How many members the gang has.")
    topology_key: str | None = optional(description="The label members share.")


class AtRisk(ApiOutput):
    """Why a live reservation may not get what it booked (SPEC §5, truth under change)."""

    reason: AtRiskReason = Field(
        description=(
            "Why, the weightiest of its atoms' holds: its node unreachable, in "
            "maintenance, held for a pool move, held in provisioning (`shape`: for "
            "exceeding its expected shape), the device reconfigured or unhealthy; for "
            "pool memory, `pool memory short` when no node of the pool is to blame."
        ),
        examples=["maintenance"],
    )
    since: EpochMs = Field(description="Since when.")
    atoms: list[str] = Field(description="The atoms it holds that are affected.")


class ReservationOut(ApiOutput):
    """A reservation as its tenant sees it, with its state now."""

    reservation_id: ReservationId = Field(description="The reservation.")
    tenant_id: TenantId = Field(description="Its tenant.")
    pool_id: PoolId = Field(description="Its pool.")
    state: ReservationState = Field(description="Its state now.")
    start: EpochMs = Field(description="When it starts.")
    end: EpochMs = Field(description="When it ends.")
    spot: bool = Field(description="Whether it may be preempted.")
    binding: Literal["hold", "node"] = Field(description="What it holds: atoms or nodes.")
    atoms: list[BookedAtomOut] = Field(description="Every atom it books.")
    created_at: EpochMs = Field(description="When it was booked.")
    project_id: ProjectId | None = optional(description="Its project, if any.")
    lease_expires_at: EpochMs | None = optional(
        description="When it expires unless renewed (leased reservations)."
    )
    preempt_at: EpochMs | None = optional(description="When it is preempted.")
    resources: dict[str, int] | None = optional(
        description="Scalar resources it books (vcpu, memoryGiB, …)."
    )
    gang: Gang | None = optional(description="Its gang, if booked as one.")
    ended_at: EpochMs | None = optional(description="When it was ended early.")
    at_risk: AtRisk | None = optional(
        description="Present while a device it holds is unavailable (live reservations only).",
    )
    warnings: list[str] | None = optional(
        description="In the answer to its create only: each GPU in unbooked use (a process no"
        " booking covers) it takes, taken only because no idle GPU fits.",
    )
    idle_since: EpochMs | None = optional(
        description="While it runs and none of its GPUs runs a process (or all stay under the"
        " idle utilization): since when, as the leader's use join sees it (`reservation.idle`"
        " follows after `idle_after_s`). Left out otherwise, and on other replicas.",
    )


class ExtendedReservation(ReservationOut):
    """A reservation after `reservations.extend` (as it would be, for a dry run)."""

    previous_end: EpochMs = Field(description="Its end before (end: its end now).")
    dry_run: bool = Field(description="True: nothing was changed; end is what it would be.")


class ReservationPage(ApiOutput):
    reservations: list[ReservationOut] = Field(description="This page, newest first.")
    next_cursor: Cursor


# --- pools ----------------------------------------------------------------------------


class PoolOut(ApiOutput):
    pool_id: PoolId = Field(description="The pool.")
    name: str = Field(description="Its name.")
    gpu_model: str | None = Field(description="Its GPU model, if set.")
    owner: TenantId = Field(description="The tenant owning it.")
    archived: bool = Field(description="Whether it is archived.")
    created_at: EpochMs = Field(description="When it was created.")
    offered_to: list[TenantId] | None = optional(
        description="Tenants it is offered to (shown to its owner only)."
    )


class PoolList(ApiOutput):
    tenant_id: TenantId = Field(description="The tenant asked about.")
    pools: list[PoolOut] = Field(description="Pools it owns or is offered.")


# --- usage ----------------------------------------------------------------------------


class UsageRow(ApiOutput):
    tenant_id: TenantId = Field(description="The tenant.")
    pool_id: PoolId = Field(description="The pool.")
    project_id: ProjectId | None = Field(description="The project (null: none).")
    resource: str = Field(description="The resource.")
    hours: float = Field(description="Unit-hours booked (as the bookings ran) in the window.")
    reservations: int = Field(description="How many reservations contributed.")
    used_hours: float | None = optional(
        "Of those, unit-hours with a process on the device (GPU classes and whole nodes;"
        " absent for other resources)."
    )
    weighted_hours: float | None = optional(
        "Used unit-hours weighted by the device's utilization (absent as usedHours, and"
        " where some of the used time had no utilization figure: MIG instances)."
    )
    efficiency: float | None = optional("usedHours / hours (absent as usedHours, or 0 booked).")


class UsageReservationRow(ApiOutput):
    reservation_id: ReservationId = Field(description="The reservation.")
    tenant_id: TenantId = Field(description="Its tenant.")
    pool_id: PoolId = Field(description="Its pool.")
    project_id: ProjectId | None = Field(description="Its project (null: none).")
    resource: str = Field(description="The class it booked (gpu, gpu.mig, gpu.slot, node).")
    hours: float = Field(description="Unit-hours booked in the window.")
    used_hours: float = Field(description="Unit-hours with a process on its devices.")
    weighted_hours: float | None = Field(
        description="Used unit-hours weighted by utilization (null: some of the used time"
        " had no utilization figure, as on MIG instances; never 0 for that)."
    )
    efficiency: float | None = Field(description="usedHours / hours (null: 0 booked).")


class UnbookedUseRow(ApiOutput):
    pool_id: PoolId = Field(description="The pool.")
    tenant_id: str | None = Field(
        default=None,
        description="The tenant its processes' owners belong to (null: unattributed).",
    )
    used_hours: float = Field(description="GPU-hours with a process that no booking covered.")
    weighted_hours: float | None = Field(
        description="Those weighted by utilization (null: some had no utilization figure)."
    )


class UsageReport(ApiOutput):
    from_: EpochMs = Field(alias="from", description="The window's start.")
    to: EpochMs = Field(description="The window's end.")
    as_of: EpochMs = Field(description="Usage is counted up to here (now, or `to`).")
    rows: list[UsageRow] = Field(description="Unit-hours per tenant, pool, project, resource.")
    totals: dict[str, float] = Field(description="Unit-hours per resource over every row.")
    used_totals: dict[str, float] = Field(
        default_factory=dict, description="Used unit-hours per resource over every row."
    )
    weighted_totals: dict[str, float | None] = Field(
        default_factory=dict,
        description="Utilization-weighted unit-hours per resource (null: some of the used"
        " time had no utilization figure, as on MIG instances).",
    )
    by_reservation: list[UsageReservationRow] = Field(
        default_factory=list,
        description="Per reservation and booked GPU class (with `byReservation`; else empty).",
    )
    unbooked: list[UnbookedUseRow] = Field(
        default_factory=list,
        description="Use no booking covered, per pool (every tenant's report only).",
    )
