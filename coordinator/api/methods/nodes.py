"""nodes.list/get/events/setMaintenance (the last calls `services/maintenance.py`),
the expected shapes and `nodes.replace` (`services/node_identity.py`).

A node is visible to a tenant exactly when its pool is; anything else is NOT_FOUND.
Maintenance is an operator's act and is recorded with its reason and author.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Annotated, Any, cast

from pydantic import Field, model_validator

from coordinator.api.http.context import CallContext
from coordinator.api.http.cursor import decode_id_cursor, encode_cursor
from coordinator.api.http.registry import REGISTRY
from coordinator.api.http.render import shown_by
from coordinator.api.shapes import node_outputs as out
from coordinator.api.shapes.base import ApiInput, Prebuilt, keys
from coordinator.api.shapes.fields import PoolId, TenantId
from coordinator.domain.disclosure import event_seen, use_seen
from coordinator.domain.errors import NotFound
from coordinator.domain.gpu_use_book import NodeUse
from coordinator.domain.gpu_use_units import GPU_CLASSES, unit_of
from coordinator.domain.model import AtomRecord, AtomView, Holder, NodeEvent, NodeRecord
from coordinator.domain.states import atom_bucket, node_status
from shared.ids import NODE_ID_PATTERN
from shared.wire import AtomClass, HealthStatus

NodeId = Annotated[str, Field(max_length=128, pattern=NODE_ID_PATTERN)]


class NodeListInput(ApiInput):
    tenant_id: TenantId | None = Field(
        default=None, description="The tenant; absent (operators only): every tenant's pools."
    )
    pool_id: PoolId | None = Field(
        default=None, description="Only this pool's; absent: every pool the tenant sees."
    )
    cursor: Annotated[str, Field(max_length=512)] | None = Field(
        default=None, description="The previous page's nextCursor."
    )
    limit: Annotated[int, Field(ge=1, le=1000)] = Field(default=100, description="Page size.")


class NodeRef(ApiInput):
    tenant_id: TenantId | None = Field(
        default=None, description="The tenant asking; absent (operators only): any node."
    )
    node_id: NodeId = Field(description="The node.", examples=["gpu-host-01"])


class NodeEventsInput(ApiInput):
    tenant_id: TenantId | None = Field(
        default=None, description="The tenant asking; absent (operators only): any node."
    )
    node_id: NodeId = Field(description="The node.", examples=["gpu-host-01"])
    after: Annotated[int, Field(ge=0, le=2**63 - 1)] = Field(
        default=0, description="Events after this id."
    )
    limit: Annotated[int, Field(ge=1, le=1000)] = Field(default=100, description="At most.")


class MaintenanceInput(ApiInput):
    node_id: NodeId = Field(description="The node.", examples=["gpu-host-01"])
    maintenance: bool = Field(description="In (true) or out of (false) maintenance.")
    reason: Annotated[str, Field(max_length=1024)] = Field(
        default="", description="Why (required when entering maintenance)."
    )

    @model_validator(mode="after")
    def _reason_required(self) -> MaintenanceInput:
        if self.maintenance and not self.reason.strip():
            raise ValueError("reason is required when entering maintenance")
        return self


ProfileId = Annotated[str, Field(max_length=128, pattern=r"^[A-Za-z0-9._:/-]{1,128}$")]


class ExpectedShapeInput(ApiInput):
    pool_id: PoolId | None = Field(
        default=None, description="The pool whose nodes it is for (or give a profile)."
    )
    profile_id: ProfileId | None = Field(
        default=None, description="The host profile it is for (with profileVersion)."
    )
    profile_version: Annotated[int, Field(ge=1)] | None = Field(
        default=None, description="That profile's version."
    )
    counts: dict[AtomClass, Annotated[int, Field(ge=0, le=100_000)]] = Field(
        description="Atoms expected per class; a node with more is held. Empty: clear it.",
        examples=[{"gpu": 8, "nic.vf": 32}],
    )

    @model_validator(mode="after")
    def _one_scope(self) -> ExpectedShapeInput:
        by_profile = self.profile_id is not None or self.profile_version is not None
        if (self.pool_id is None) == (not by_profile):
            raise ValueError("give either poolId or profileId with profileVersion")
        if by_profile and (self.profile_id is None or self.profile_version is None):
            raise ValueError("profileId and profileVersion go together")
        return self


class NodeReplaceInput(ApiInput):
    old_node_id: NodeId = Field(
        description="The node that is not (or no longer) the real host.", examples=["gpu-host-01"]
    )
    new_node_id: NodeId = Field(
        description="The node that is that host now.", examples=["gpu-host-01b"]
    )

    @model_validator(mode="after")
    def _two_nodes(self) -> NodeReplaceInput:
        if self.old_node_id == self.new_node_id:
            raise ValueError("oldNodeId and newNodeId must differ")
        return self


class ShapeAcceptInput(ApiInput):
    node_id: NodeId = Field(description="The node held for exceeding its expected shape.")


# nodes.list and nodes.get answer with dicts keyed by their models' own keys: a model
# round trip costs about 10x on a 1,000-node page (model_construct more still, being
# Python), so these keys, read from node_outputs, are what keeps the shape declared once.
_NODE, _ATOM = keys(out.NodeDetail), keys(out.HeldAtom)
_FLAGS, _RES = keys(out.NodeFlags), keys(out.NodeResources)
_REACH, _HEALTH = keys(out.Reachable), keys(out.HealthFlag)
_MAINT, _PROV = keys(out.MaintenanceFlag), keys(out.ProvisioningFlag)
_HOLDER, _OTHER = keys(out.Holder), keys(out.OtherHolder)
_USE, _USER = keys(out.GpuUse), keys(out.GpuUser)
_PAGE = keys(out.NodePage)


def _node(node: NodeRecord, atoms: object, operator: bool) -> dict[str, Any]:
    """A node as `NodeSummary` (atoms counted) or `NodeDetail` (atoms listed)."""
    s = node.state
    return {
        _NODE.node_id: node.node_id,
        _NODE.pool_id: node.pool_id,
        _NODE.hostname: node.hostname,
        _NODE.status: node_status(s),
        _NODE.labels: node.labels,
        _NODE.profile_id: node.profile_id,
        _NODE.profile_version: node.profile_version,
        _NODE.state: {
            _FLAGS.reachable: {_REACH.value: s.reachable, _REACH.since: node.reachable_since},
            _FLAGS.health: {
                _HEALTH.value: s.health,
                _HEALTH.reasons: list(node.health_reasons),
                _HEALTH.since: node.health_since,
            },
            _FLAGS.maintenance: {
                _MAINT.value: s.maintenance,
                _MAINT.reason: node.maintenance_reason,
                _MAINT.by: shown_by(node.maintenance_by, operator),
                _MAINT.since: node.maintenance_since,
            },
            _FLAGS.provisioning: {
                _PROV.value: s.provisioning,
                _PROV.reason: node.duplicate_hold or node.shape_hold,
            },
        },
        _NODE.last_seen: node.last_seen,
        _NODE.interval_ms: node.interval_ms,
        _NODE.resources: {
            _RES.vcpu: node.vcpu,
            _RES.memory_gib: node.memory_gib,
            _RES.hugepages1_gi: node.hugepages_1gi,
        },
        _NODE.atoms: atoms,
    }


def node_summary(node: NodeRecord, counts: dict[str, int], *, operator: bool) -> dict[str, Any]:
    """A node in a listing (`NodeSummary`): its atoms counted per class."""
    return _node(node, counts, operator)


def event_out(e: NodeEvent, *, operator: bool = False) -> out.NodeEventOut:
    return out.NodeEventOut(
        event_id=e.event_id,
        node_id=e.node_id,
        pool_id=e.pool_id,
        kind=e.kind,
        reason=e.reason,
        by=shown_by(e.by, operator),
        at=e.at,
        device_id=e.device_id,
    )


def _holder(holder: Holder | None, viewer: str | None) -> dict[str, Any] | None:
    """Who holds an atom now; another tenant's reservation is only said to exist."""
    if holder is None:
        return None
    if viewer is not None and holder.tenant_id != viewer:
        return {_OTHER.other: True}
    return {
        _HOLDER.reservation_id: holder.reservation_id,
        _HOLDER.tenant_id: holder.tenant_id,
        _HOLDER.project_id: holder.project_id,
        _HOLDER.until: holder.until,
    }


def _use(
    use: NodeUse | None, unit: str, holders: Mapping[str, str], viewer: str | None
) -> dict[str, Any] | None:
    """What runs on a GPU unit now, as the viewer may see it (`domain.disclosure`):
    `holders` are the reservations covering the unit (→ their tenants)."""
    device = use.devices.get(unit) if use is not None else None
    if use is None or device is None:
        return None
    seen = use_seen(device, holders, viewer)
    return {
        _USE.in_use: seen.in_use,
        _USE.sm_util: seen.sm_util,
        _USE.memory_used_mib: seen.memory_used_mib,
        _USE.processes: seen.processes,
        _USE.users: [
            {_USER.pid: p.pid, _USER.owner: p.owner, _USER.owner_kind: p.owner_kind}
            | ({_USER.owner_name: p.owner_name} if p.owner_name else {})
            for p in seen.users
        ],
        _USE.at: use.updated_at,
    }


def held_atom(
    node: NodeRecord,
    rec: AtomRecord,
    holder: Holder | None,
    viewer: str | None,
    use: NodeUse | None,
    covering: Callable[[str], Mapping[str, str]],
) -> dict[str, Any]:
    """An atom as `HeldAtom`: its rollup bucket, the reservation holding it now and, for
    GPU classes, what runs there (`use`: its node's last use report), shown as the
    reservations `covering` its unit (→ their tenants) let the viewer see it."""
    view = AtomView(rec.atom_id, node.node_id, cast(AtomClass, rec.cls), rec.device_id,
                    cast(HealthStatus, rec.health))  # fmt: skip
    atom: dict[str, Any] = {
        _ATOM.atom_id: rec.atom_id,
        _ATOM.cls: rec.cls,
        _ATOM.device_id: rec.device_id,
        _ATOM.health: rec.health,
        _ATOM.health_reasons: list(rec.health_reasons),
        _ATOM.attrs: rec.attrs,
        _ATOM.bucket: atom_bucket(node.state, view),
        _ATOM.held_by: _holder(holder, viewer),
    }
    if rec.cls in GPU_CLASSES:
        unit = unit_of(rec.cls, rec.atom_id, rec.device_id, rec.attrs)
        now_use = _use(use, unit, covering(unit), viewer)
        if now_use is not None:
            atom[_ATOM.use] = now_use
    return atom


def node_detail(
    node: NodeRecord,
    holders: dict[str, Holder],
    viewer: str | None,
    *,
    operator: bool = False,
    use: NodeUse | None = None,
) -> dict[str, Any]:
    """A node (`NodeDetail`) with every atom (`held_atom`)."""
    # Who holds each GPU unit (several on a time-sliced GPU): what its use shows depends
    # on them all, not on one slot's holder.
    unit_holders: dict[str, dict[str, str]] = {}
    whole: dict[str, str] = {}  # a whole-node booking covers every unit
    for rec in node.atoms:
        h = holders.get(rec.atom_id)
        if rec.cls == "node" and h is not None:
            whole[h.reservation_id] = h.tenant_id
        elif rec.cls in GPU_CLASSES and h is not None:
            unit = unit_of(rec.cls, rec.atom_id, rec.device_id, rec.attrs)
            unit_holders.setdefault(unit, {})[h.reservation_id] = h.tenant_id

    def covering(unit: str) -> dict[str, str]:
        return whole | unit_holders.get(unit, {})

    atoms = [
        held_atom(node, rec, holders.get(rec.atom_id), viewer, use, covering) for rec in node.atoms
    ]
    return _node(node, atoms, operator)


async def _visible_node(ctx: CallContext, tenant_id: str | None, node_id: str) -> NodeRecord:
    node = await ctx.ledger.catalog.node(node_id)
    pool = await ctx.ledger.pools.get(node.pool_id) if node else None
    if node is None or pool is None or (tenant_id is not None and not pool.visible_to(tenant_id)):
        raise NotFound(f"node {node_id} not found")
    return node


async def _listed_pools(ctx: CallContext, body: NodeListInput) -> list[str]:
    if body.pool_id is not None:
        pool = await ctx.ledger.pools.get(body.pool_id)
        if pool is None or (body.tenant_id is not None and not pool.visible_to(body.tenant_id)):
            raise NotFound(f"pool {body.pool_id} not found")
        return [pool.pool_id]
    if body.tenant_id is None:
        return [p.pool_id for p in await ctx.ledger.pools.list_all()]
    return [p.pool_id for p in await ctx.ledger.pools.list_visible(body.tenant_id)]


@REGISTRY.method(
    "nodes.list", kind="read", permission="compute:nodes:read", scope="compute-tenant",
    input=NodeListInput, output=out.NodePage, phase="v0.2",
)  # fmt: skip
async def nodes_list(ctx: CallContext, body: NodeListInput) -> Prebuilt[out.NodePage]:
    """Nodes with their state, ordered by nodeId, a page at a time: one pool's, or
    (poolId left out) every pool's the tenant sees; operators may leave out tenantId."""
    after = decode_id_cursor(body.cursor) if body.cursor else None
    pools = await _listed_pools(ctx, body)
    found = await ctx.ledger.catalog.nodes(pools, after, body.limit + 1)
    nodes, counts = found.nodes, found.atom_counts
    page, more = nodes[: body.limit], len(nodes) > body.limit
    operator = ctx.principal.reads_every_tenant
    return Prebuilt(
        out.NodePage,
        {
            _PAGE.pool_id: body.pool_id,
            _PAGE.nodes: [
                node_summary(n, counts.get(n.node_id, {}), operator=operator) for n in page
            ],
            _PAGE.next_cursor: encode_cursor(page[-1].node_id) if more and page else None,
        },
    )


@REGISTRY.method(
    "nodes.get", kind="read", permission="compute:nodes:read", scope="compute-tenant",
    input=NodeRef, output=out.NodeDetail, phase="v0.2",
)  # fmt: skip
async def nodes_get(ctx: CallContext, body: NodeRef) -> Prebuilt[out.NodeDetail]:
    """One node with its state flags and every atom with its bucket and holder
    (NOT_FOUND unless its pool is visible)."""
    node = await _visible_node(ctx, body.tenant_id, body.node_id)
    holders = await ctx.ledger.catalog.holders(node.node_id, ctx.now())
    detail = node_detail(
        node, holders, body.tenant_id, operator=ctx.principal.reads_every_tenant,
        use=ctx.services.gpu_use.nodes.get(node.node_id),
    )  # fmt: skip
    return Prebuilt(out.NodeDetail, detail)


@REGISTRY.method(
    "nodes.events", kind="read", permission="compute:nodes:read", scope="compute-tenant",
    input=NodeEventsInput, output=out.NodeEvents, phase="v0.2",
)  # fmt: skip
async def nodes_events(ctx: CallContext, body: NodeEventsInput) -> out.NodeEvents:
    """A node's recorded transitions, oldest first, after an event id (a tenant sees
    GPU use events in general words: their reasons name other tenants' reservations)."""
    await _visible_node(ctx, body.tenant_id, body.node_id)
    events = await ctx.ledger.catalog.events(body.node_id, body.after, body.limit)
    operator = ctx.principal.reads_every_tenant
    seen = [event_seen(e, None if operator else body.tenant_id) for e in events]
    return out.NodeEvents(
        node_id=body.node_id, events=[event_out(e, operator=operator) for e in seen]
    )


@REGISTRY.method(
    "nodes.setMaintenance", kind="write", permission="platform:admin", scope="platform",
    input=MaintenanceInput, output=out.MaintenanceSet, phase="v0.2",
)  # fmt: skip
async def nodes_set_maintenance(ctx: CallContext, body: MaintenanceInput) -> out.MaintenanceSet:
    """Put a node in or out of maintenance with a reason (operator). Its atoms move to
    the maintenance bucket at once; the change is a node event and an alert, and the
    reservations it puts at risk are counted in the answer (each holder is alerted)."""
    by = f"{ctx.principal.tenant_id}/{ctx.principal.key_id}"
    done = await ctx.services.maintenance.set(body.node_id, body.maintenance, body.reason, by)
    node = await ctx.ledger.catalog.node(body.node_id)
    assert node is not None
    return out.MaintenanceSet(
        node_id=node.node_id,
        pool_id=node.pool_id,
        status=node_status(node.state),
        maintenance=node.state.maintenance,
        reason=node.maintenance_reason,
        changed=done.changed,
        reservations_at_risk=done.reservations_at_risk,
    )


@REGISTRY.method(
    "nodes.setExpectedShape", kind="write", permission="platform:admin", scope="platform",
    input=ExpectedShapeInput, output=out.ExpectedShapeSet, phase="v0.3",
)  # fmt: skip
async def nodes_set_expected_shape(
    ctx: CallContext, body: ExpectedShapeInput
) -> out.ExpectedShapeSet:
    """Set the atom counts per class expected of a pool's nodes or of a host profile
    version's (operator); empty counts clear it. A node with more than a shape that
    applies to it is held in provisioning, with the reason, until accepted
    (`nodes.acceptShape`): judged at once by its last inventory, and at each one."""
    by = f"{ctx.principal.tenant_id}/{ctx.principal.key_id}"
    profile = (
        (body.profile_id, body.profile_version)
        if body.profile_id is not None and body.profile_version is not None
        else None
    )
    counts = {str(cls): n for cls, n in body.counts.items()}
    shape = await ctx.services.shapes.expect(body.pool_id, profile, counts, by)
    return out.ExpectedShapeSet(
        pool_id=shape.pool_id or None,
        profile_id=shape.profile_id or None,
        profile_version=shape.profile_version or None,
        counts=dict(shape.counts),
        updated_at=shape.updated_at,
    )


@REGISTRY.method(
    "nodes.acceptShape", kind="write", permission="platform:admin", scope="platform",
    input=ShapeAcceptInput, output=out.ShapeAccepted, phase="v0.3",
)  # fmt: skip
async def nodes_accept_shape(ctx: CallContext, body: ShapeAcceptInput) -> out.ShapeAccepted:
    """Accept a node's inventory as it is (operator): its atom counts are recorded as
    accepted and a hold for exceeding an expected shape ends. A later inventory with
    more than was accepted is held again."""
    by = f"{ctx.principal.tenant_id}/{ctx.principal.key_id}"
    changes = await ctx.services.shapes.accept(body.node_id, by)
    node = await ctx.ledger.catalog.node(body.node_id, with_atoms=False)
    assert node is not None
    return out.ShapeAccepted(
        node_id=node.node_id,
        pool_id=node.pool_id,
        status=node_status(node.state),
        provisioning=node.state.provisioning,
        changed=bool(changes.transitions),
    )


@REGISTRY.method(
    "nodes.replace", kind="write", permission="platform:admin", scope="platform",
    input=NodeReplaceInput, output=out.NodeReplaced, phase="v0.3",
)  # fmt: skip
async def nodes_replace(ctx: CallContext, body: NodeReplaceInput) -> out.NodeReplaced:
    """Say which of two nodes showing the same physical devices is the real host
    (operator): the new node takes the old one's devices, the old node's bookings that
    have not ended move to it where it shows the same devices (else they end, and the
    answer lists which), the old node is held in provisioning as replaced, and the new
    node's duplicate-device hold ends. To keep the node that was there first, replace
    the newcomer by it."""
    by = f"{ctx.principal.tenant_id}/{ctx.principal.key_id}"
    done = await ctx.services.node_identity.replace(body.old_node_id, body.new_node_id, by)
    node = await ctx.ledger.catalog.node(body.new_node_id, with_atoms=False)
    assert node is not None
    return out.NodeReplaced(
        old_node_id=body.old_node_id,
        new_node_id=body.new_node_id,
        status=node_status(node.state),
        moved=list(done.moved),
        ended=list(done.ended),
    )
