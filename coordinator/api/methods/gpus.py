"""gpus.list: every GPU, MIG instance and time-slice slot of the fleet (or of a pool, a
node, nodes with some labels, a model) with its state, holder and use, a page at a
time, as `nodes.get` shows each atom.

One request and a bounded number of statements a page, whatever the number of nodes
(`ledger/gpu_listing.py`); use comes from this replica's use book, which every replica
keeps from the heartbeats. A tenant sees the pools visible to it, other tenants' holders
only as held, and use as `domain.disclosure` allows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, get_args

from pydantic import Field

from coordinator.api.http.context import CallContext
from coordinator.api.http.cursor import decode_key_cursor, encode_cursor
from coordinator.api.http.registry import REGISTRY
from coordinator.api.methods.nodes import NodeId, held_atom
from coordinator.api.shapes import node_outputs as out
from coordinator.api.shapes.base import ApiInput, Prebuilt, keys
from coordinator.api.shapes.fields import PoolId, TenantId
from coordinator.domain.errors import NotFound
from coordinator.domain.model import GpuState, Holder, Pool, UseState
from coordinator.domain.states import gpu_state, use_state
from coordinator.ledger import GpuFilter

LabelKey = Annotated[str, Field(min_length=1, max_length=128)]
LabelValue = Annotated[str, Field(max_length=256)]
Model = Annotated[str, Field(min_length=1, max_length=128)]
_STATES = len(get_args(GpuState)) + len(get_args(UseState))


class GpuListInput(ApiInput):
    tenant_id: TenantId | None = Field(
        default=None, description="The tenant; absent (operators only): every tenant's pools."
    )
    pool_id: PoolId | None = Field(
        default=None, description="Only this pool's; absent: every pool the tenant sees."
    )
    node_id: NodeId | None = Field(default=None, description="Only this node's.")
    labels: Annotated[dict[LabelKey, LabelValue], Field(max_length=32)] = Field(
        default_factory=dict, description="Only nodes with every one of these labels."
    )
    model: Annotated[list[Model], Field(max_length=16)] = Field(
        default_factory=list,
        description="Only models containing any of these, any case (`H100` matches"
        " `NVIDIA H100 80GB HBM3`); empty: every model.",
    )
    state: Annotated[list[GpuState | UseState], Field(max_length=_STATES)] = Field(
        default_factory=list,
        description="Only units in any of these states, or (busy, idle, unbooked: busy with"
        " nobody holding it) running so; empty: every unit.",
    )
    cursor: Annotated[str, Field(max_length=1024)] | None = Field(
        default=None, description="The previous page's nextCursor."
    )
    limit: Annotated[int, Field(ge=1, le=1000)] = Field(default=100, description="Page size.")


_UNIT, _PAGE = keys(out.GpuUnit), keys(out.GpuPage)
_ATOM, _USE = keys(out.HeldAtom), keys(out.GpuUse)


async def _pools(ctx: CallContext, body: GpuListInput) -> list[Pool]:
    if body.pool_id is not None:
        pool = await ctx.ledger.pools.get(body.pool_id)
        if pool is None or (body.tenant_id is not None and not pool.visible_to(body.tenant_id)):
            raise NotFound(f"pool {body.pool_id} not found")
        return [pool]
    if body.tenant_id is None:
        return await ctx.ledger.pools.list_all()
    return await ctx.ledger.pools.list_visible(body.tenant_id)


def _covering(
    whole: dict[str, str], units: dict[str, dict[str, str]]
) -> Callable[[str], dict[str, str]]:
    """A unit → the reservations covering it (whole-node ones cover every unit)."""
    return lambda unit: whole | units.get(unit, {})


@REGISTRY.method(
    "gpus.list", kind="read", permission="compute:nodes:read", scope="compute-tenant",
    input=GpuListInput, output=out.GpuPage, phase="v0.3",
)  # fmt: skip
async def gpus_list(ctx: CallContext, body: GpuListInput) -> Prebuilt[out.GpuPage]:
    """Every GPU, MIG instance and time-slice slot the tenant sees (operators: the whole
    fleet), by nodeId then atomId, a page at a time: each with its node, pool, model,
    state (free, held or its node's hold), holder and what runs on it, as `nodes.get`
    shows it. Filters: pool, node, labels, model, state."""
    pools = await _pools(ctx, body)
    names = {p.pool_id: p.name for p in pools}
    wanted = GpuFilter(list(names), body.node_id, dict(body.labels), tuple(body.model))
    after = decode_key_cursor(body.cursor) if body.cursor else None
    states = frozenset(body.state)
    now = ctx.now()
    # A state filter is judged here, so its page reads every unit after the cursor.
    rows = await ctx.ledger.gpus.page(wanted, after, None if states else body.limit + 1, now)
    holders: dict[str, Holder] = {}
    covering: dict[str, dict[str, dict[str, str]]] = {}  # node → unit → rid → tenant
    whole: dict[str, dict[str, str]] = {}  # node → rid → tenant
    for hold in rows.holds:
        h = hold.holder
        holders[hold.atom_id] = h
        if hold.cls == "node":
            whole.setdefault(hold.node_id, {})[h.reservation_id] = h.tenant_id
        elif hold.unit is not None:
            by_unit = covering.setdefault(hold.node_id, {})
            by_unit.setdefault(hold.unit, {})[h.reservation_id] = h.tenant_id
    found: list[dict[str, Any]] = []
    more = False
    for listed in rows.units:
        node, rec = listed.node, listed.atom
        node_whole, node_units = whole.get(node.node_id, {}), covering.get(node.node_id, {})
        atom = held_atom(
            node, rec, holders.get(rec.atom_id), body.tenant_id,
            ctx.services.gpu_use.nodes.get(node.node_id),
            _covering(node_whole, node_units),
        )  # fmt: skip
        held = atom[_ATOM.held_by] is not None
        state = gpu_state(atom[_ATOM.bucket], held)
        use = atom.get(_ATOM.use)
        running = use_state(use is not None, bool(use and use[_USE.in_use]), held)
        if states and state not in states and running not in states:
            continue
        if len(found) == body.limit:
            more = True
            break
        model = rec.attrs.get("model")
        found.append(
            atom | {
                _UNIT.node_id: node.node_id, _UNIT.pool_id: node.pool_id,
                _UNIT.pool_name: names.get(node.pool_id, ""),
                _UNIT.model: model if isinstance(model, str) else "", _UNIT.state: state,
            }
        )  # fmt: skip
    last = found[-1] if found else None
    cursor = encode_cursor([last[_UNIT.node_id], last[_ATOM.atom_id]]) if more and last else None
    return Prebuilt(out.GpuPage, {_PAGE.gpus: found, _PAGE.next_cursor: cursor})
