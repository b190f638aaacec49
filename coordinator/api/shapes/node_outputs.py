"""Output models of the nodes methods: a node with its state flags, its atoms (counted
per class in listings, one by one with bucket and holder in `nodes.get`), its events,
and the answer to `nodes.setMaintenance`."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from coordinator.api.shapes.base import ApiOutput, optional
from coordinator.api.shapes.fields import EpochMs, PoolId, ProjectId, TenantId
from coordinator.api.shapes.outputs import Cursor, ReservationId
from coordinator.domain.model import GpuState, NodeStatus, RollupBucket
from shared.wire import AtomClass, HealthStatus

AttrValue = str | int | float | bool | None


class Reachable(ApiOutput):
    value: bool = Field(description="Whether heartbeats arrive in time.")
    since: EpochMs = Field(description="Since when.")


class HealthFlag(ApiOutput):
    value: HealthStatus = Field(description="The node's health.")
    reasons: list[str] = Field(description="Why, when not healthy (XIDs, …).")
    since: EpochMs = Field(description="Since when.")


class MaintenanceFlag(ApiOutput):
    value: bool = Field(description="Whether an operator put the node in maintenance.")
    reason: str = Field(description="The operator's reason.")
    by: str = Field(description="Who did it.")
    since: EpochMs | None = Field(description="Since when (null: never).")


class ProvisioningFlag(ApiOutput):
    value: bool = Field(description="Whether the node is still provisioning.")
    reason: str = Field(
        description="Why the coordinator holds it there (an expected shape exceeded), or empty."
    )


class NodeFlags(ApiOutput):
    reachable: Reachable = Field(description="Heard from in time.")
    health: HealthFlag = Field(description="Health as the agent reports it.")
    maintenance: MaintenanceFlag = Field(description="Set by operators.")
    provisioning: ProvisioningFlag = Field(description="Not yet ready for bookings.")


class NodeResources(ApiOutput):
    vcpu: int = Field(description="vCPUs.")
    memory_gib: int = Field(alias="memoryGiB", description="Memory, GiB.")
    hugepages1_gi: int = Field(alias="hugepages1Gi", description="1 GiB huge pages.")


class _NodeBase(ApiOutput):
    node_id: str = Field(description="The node.", examples=["gpu-host-01"])
    pool_id: PoolId = Field(description="Its pool.")
    hostname: str = Field(description="Its host name.")
    status: NodeStatus = Field(description="One word: its bucket, or ready/degraded.")
    labels: dict[str, str] = Field(description="Its labels (selectors match these).")
    profile_id: str | None = Field(description="Its node profile, if any.")
    profile_version: int | None = Field(description="That profile's version.")
    state: NodeFlags = Field(description="Its state flags.")
    last_seen: EpochMs = Field(description="Its last heartbeat.")
    interval_ms: int = Field(description="Its heartbeat interval.")
    resources: NodeResources = Field(description="Its scalar resources.")


class NodeSummary(_NodeBase):
    """A node in a listing: its atoms counted per class."""

    atoms: dict[str, int] = Field(description="How many atoms of each class.")


class AtomOut(ApiOutput):
    atom_id: str = Field(description="The atom.")
    cls: AtomClass = Field(alias="class", description="Its class.")
    device_id: str = Field(description="The physical device (GPU UUID, …).")
    health: HealthStatus = Field(description="Its health.")
    health_reasons: list[str] = Field(description="Why, when not healthy.")
    attrs: dict[str, AttrValue] = Field(description="Its attributes (model, memory, …).")


class OtherHolder(ApiOutput):
    """Held by another tenant's reservation: only that it is held is said."""

    other: Literal[True] = Field(description="Always true.")


class Holder(ApiOutput):
    reservation_id: ReservationId = Field(description="The reservation holding it.")
    tenant_id: TenantId = Field(description="Its tenant.")
    project_id: ProjectId | None = Field(description="Its project.")
    until: EpochMs = Field(description="Until when.")


class GpuUser(ApiOutput):
    pid: int = Field(description="The process id on its host.")
    owner: str = Field(description="Its reservation id, pod UID, job id, unit or container id.")
    owner_kind: str = Field(description="reservation, pod, slurm, systemd, container or unknown.")
    owner_name: str | None = optional(
        description="Its readable name where the agent read one: a pod's namespace/name, a"
        " Slurm job's user, a container's name (left out otherwise)."
    )


class GpuUse(ApiOutput):
    """What runs on a GPU or MIG instance, as its agent last reported it. A tenant sees
    it all where it alone holds the unit; on a unit it shares (time-slice slots) its own
    reservations' processes only, their count, memory and utilization; on another
    tenant's only `inUse`; on one nobody holds `inUse` and `processes`."""

    in_use: bool = Field(description="A compute process runs on it.")
    sm_util: int | None = Field(
        description="SM utilization, % (null: NVML cannot say, or not the viewer's to see)."
    )
    memory_used_mib: int | None = Field(
        description="Memory used, MiB (null: unknown, or not the viewer's to see)."
    )
    processes: int = Field(
        description="How many compute processes (a tenant: its own, or on a unit nobody holds)."
    )
    users: list[GpuUser] = Field(
        description="Its processes and owners (a tenant: its own reservations' only)."
    )
    at: EpochMs = Field(description="When the coordinator last heard of it.")


class HeldAtom(AtomOut):
    bucket: RollupBucket = Field(description="Its rollup bucket now.")
    held_by: Holder | OtherHolder | None = Field(description="Who holds it now (null: free).")
    use: GpuUse | None = optional(
        "GPU classes on a node whose agent reports use: what runs there now."
    )


class NodeDetail(_NodeBase):
    """One node with every atom, its bucket and its holder."""

    atoms: list[HeldAtom] = Field(description="Every atom.")


class GpuUnit(HeldAtom):
    """A GPU, MIG instance or time-slice slot in `gpus.list`: the atom as `nodes.get` shows
    it, with its node, pool, model and one-word state."""

    node_id: str = Field(description="Its node.", examples=["gpu-host-01"])
    pool_id: PoolId = Field(description="Its node's pool.")
    pool_name: str = Field(description="That pool's name.")
    model: str = Field(description="Its model as the agent reports it (empty: unknown).")
    state: GpuState = Field(
        description="Its bucket when out of service (provisioning, unhealthy, maintenance,"
        " unreachable), else held or free."
    )


class GpuPage(ApiOutput):
    gpus: list[GpuUnit] = Field(description="This page, by nodeId then atomId.")
    next_cursor: Cursor


class NodePage(ApiOutput):
    pool_id: PoolId | None = Field(description="The pool listed (null: every visible pool).")
    nodes: list[NodeSummary] = Field(description="This page, by nodeId.")
    next_cursor: Cursor


class NodeEventOut(ApiOutput):
    event_id: int = Field(description="The event's id (pass as `after`).")
    node_id: str = Field(description="The node.")
    pool_id: PoolId = Field(description="Its pool then.")
    kind: str = Field(description="What happened (node.unreachable, …).")
    reason: str = Field(description="Why.")
    by: str = Field(description="Who or what did it.")
    at: EpochMs = Field(description="When.")
    device_id: str | None = Field(description="The device concerned, if one.")


class NodeEvents(ApiOutput):
    node_id: str = Field(description="The node.")
    events: list[NodeEventOut] = Field(description="Its events, oldest first.")


class MaintenanceSet(ApiOutput):
    """The brief answer to `nodes.setMaintenance` (`nodes.get` has the whole node)."""

    node_id: str = Field(description="The node.")
    pool_id: PoolId = Field(description="Its pool.")
    status: NodeStatus = Field(description="One word: its bucket, or ready/degraded.")
    maintenance: bool = Field(description="Its maintenance flag now.")
    reason: str = Field(description="The maintenance reason recorded (empty when off).")
    changed: bool = Field(description="False when the node already was in that state.")
    reservations_at_risk: Annotated[int, Field(ge=0)] = Field(
        description="How many live reservations (interval ones included) it put at risk."
    )


class ExpectedShapeSet(ApiOutput):
    """The expected shape as set (empty counts: cleared)."""

    pool_id: PoolId | None = Field(description="The pool it is for (null: a profile's).")
    profile_id: str | None = Field(description="The host profile it is for (null: a pool's).")
    profile_version: int | None = Field(description="That profile's version.")
    counts: dict[str, int] = Field(description="Atoms expected per class.")
    updated_at: EpochMs = Field(description="When it was set.")


class NodeReplaced(ApiOutput):
    """The answer to `nodes.replace`: what became of the old node's bookings."""

    old_node_id: str = Field(description="The node retired: held in provisioning as replaced.")
    new_node_id: str = Field(description="The node kept, with the old node's devices.")
    status: NodeStatus = Field(description="The kept node's status now.")
    moved: list[str] = Field(
        description="Reservations of the old node that moved to the kept node (same ids)."
    )
    ended: list[str] = Field(
        description="Reservations of the old node that ended now (preempted): the kept node "
        "does not show a device they held, or is in another pool, or is booked then."
    )


class ShapeAccepted(ApiOutput):
    """The answer to `nodes.acceptShape` (`nodes.get` has the whole node)."""

    node_id: str = Field(description="The node.")
    pool_id: PoolId = Field(description="Its pool.")
    status: NodeStatus = Field(description="One word: its bucket, or ready/degraded.")
    provisioning: bool = Field(description="Its provisioning flag now (the agent's own).")
    changed: bool = Field(description="False when it was not held.")
