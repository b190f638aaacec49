"""capacity.summary, byPool, preview and timeline, exactly as seed 000 describes them.

Both read the stored per-pool rollup. `byGpuModel` sums only each pool's `gpu` row, and
pools without a GPU model count under `other`.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from coordinator.api import outputs as out
from coordinator.api import render
from coordinator.api.context import CallContext
from coordinator.api.fields import EpochMs, PoolId, TenantId
from coordinator.api.registry import REGISTRY, ApiInput
from coordinator.api.reservation_input import ReservationCreateInput
from coordinator.domain.model import Pool, RollupRow
from coordinator.domain.placement_model import NodePick
from coordinator.domain.rollup import sum_rows
from coordinator.domain.timeline import TimelineError, booked_per_bucket, resolve_window
from coordinator.errors import InvalidInput
from coordinator.services.reservations import resolve_start, shortfall_details


class SummaryInput(ApiInput):
    tenant_id: TenantId = Field(description="The tenant whose visible pools to sum.")


class FleetInput(ApiInput):
    pass


class PreviewInput(ReservationCreateInput):
    """A reservation request to try: seed 000 has it validated as `reservations.create`'s
    input, `idempotencyKey` included (the CLI fills one in); nothing is booked with it."""


class ByPoolInput(ApiInput):
    tenant_id: TenantId = Field(description="The tenant asking (owner or offered).")
    pool_id: PoolId = Field(description="The pool.")


_MODEL_COLUMNS = ("total", "allocatable", "allocated", "reserved", "available")


@REGISTRY.method(
    "capacity.summary",
    kind="read",
    permission="compute:capacity:read",
    scope="compute-tenant",
    input=SummaryInput,
    output=out.CapacitySummary,
    phase="v0.1",
)
async def summary(ctx: CallContext, body: SummaryInput) -> dict[str, Any]:
    """Every pool the tenant owns or is offered with its rollup rows, plus whole-GPU
    totals per GPU model.

    Archived pools appear only for their owner."""
    pools = await ctx.ledger.pools.list_visible(body.tenant_id)
    return {"tenantId": body.tenant_id, **await _pools_capacity(ctx, pools)}


@REGISTRY.method(
    "capacity.fleet", kind="read", permission="platform:admin", scope="platform",
    input=FleetInput, output=out.CapacitySummary, phase="v0.3",
)  # fmt: skip
async def fleet(ctx: CallContext, body: FleetInput) -> dict[str, Any]:
    """capacity.summary over every pool of every tenant, archived ones included (operator)."""
    return {"tenantId": None, **await _pools_capacity(ctx, await ctx.ledger.pools.list_all())}


async def _pools_capacity(ctx: CallContext, pools: list[Pool]) -> dict[str, Any]:
    rows = await ctx.ledger.rollup(p.pool_id for p in pools)
    gpu_rows: dict[str, list[RollupRow]] = {}
    for pool in pools:
        for row in rows[pool.pool_id]:
            if row.resource == "gpu":
                gpu_rows.setdefault(pool.gpu_model or "other", []).append(row)
    by_model: dict[str, dict[str, int]] = {}
    for model, model_rows in sorted(gpu_rows.items()):
        total = sum_rows(model_rows, "gpu")
        by_model[model] = {c: getattr(total, c) for c in _MODEL_COLUMNS}
    return {
        "pools": [
            {
                "poolId": p.pool_id,
                "name": p.name,
                "gpuModel": p.gpu_model,
                "owner": p.owner,
                "archived": p.archived,
                "capacity": [render.rollup_row(r) for r in rows[p.pool_id]],
            }
            for p in pools
        ],
        "byGpuModel": by_model,
    }


@REGISTRY.method(
    "capacity.byPool",
    kind="read",
    permission="compute:capacity:read",
    scope="compute-pool",
    input=ByPoolInput,
    output=out.PoolRows,
    phase="v0.2",
)
async def by_pool(ctx: CallContext, body: ByPoolInput) -> dict[str, Any]:
    """One pool's rollup rows, one per resource, ordered by resource name.

    NOT_FOUND when the pool is not owned by or offered to the tenant, or is archived and
    the tenant is not its owner."""
    pool = ctx.require_pool()
    rows = (await ctx.ledger.rollup([pool.pool_id]))[pool.pool_id]
    return {"poolId": pool.pool_id, "rows": [render.rollup_row(r) for r in rows]}


class TimelineInput(ApiInput):
    tenant_id: TenantId = Field(description="The tenant asking (owner or offered).")
    pool_id: PoolId = Field(description="The pool.")
    from_: EpochMs | None = Field(
        default=None, alias="from", description="Window start (default: this hour's start)."
    )
    to: EpochMs | None = Field(default=None, description="Window end (default: from + 24 h).")
    step_minutes: Annotated[int, Field(ge=5, le=1440)] | None = Field(
        default=None, description="Bucket length (default 60)."
    )


def _candidate(pick: NodePick) -> dict[str, Any]:
    return {
        "nodeId": pick.node_id,
        "atoms": [{"atomId": a.atom_id, "class": a.cls, **a.attrs} for a in pick.atoms],
        "score": pick.score,
    }


@REGISTRY.method(
    "capacity.preview", kind="read", permission="compute:capacity:read",
    scope="compute-pool", input=PreviewInput, output=out.Preview, phase="v0.2",
)  # fmt: skip
async def preview(ctx: CallContext, body: PreviewInput) -> dict[str, Any]:
    """Run the placer on a reservation request without booking anything.

    The input is validated as for reservations.create, but idempotencyKey is optional
    (and ignored); nothing is written and no quota is checked. Up to 10 ranked
    candidates (a gang's members; whole nodes for binding 'node'); `preemptible` gives
    a count and a start, never ids. When it does not fit, `filtered` counts the nodes
    the placer turned away, by reason."""
    now = ctx.now()
    start = resolve_start(body.start, now)
    preview = await ctx.ledger.bookings.preview(
        body.pool_id, body.placement(), start, start + body.duration_ms, now,
        ctx.services.notice_ms,
    )  # fmt: skip
    placement, preemptible = preview.placement, preview.preemptible
    out: dict[str, Any] = {
        "fits": placement.fits,
        "candidates": [_candidate(p) for p in placement.candidates],
    }
    if not placement.fits:
        details = shortfall_details(placement)
        out["reason"] = placement.reason
        out["shortfalls"] = details["devices"]
        out["filtered"] = dict(sorted(placement.filtered.items()))
    if preemptible is not None:
        out["preemptible"] = {"count": preemptible.count, "startsAt": preemptible.starts_at}
    return out


@REGISTRY.method(
    "capacity.timeline", kind="read", permission="compute:capacity:read",
    scope="compute-pool", input=TimelineInput, output=out.Timeline, phase="v0.2",
)  # fmt: skip
async def timeline(ctx: CallContext, body: TimelineInput) -> dict[str, Any]:
    """Whole GPUs booked per time bucket and how many of the allocatable remain free.

    `from` defaults to the start of the current hour, `to` to 24 h after `from`,
    `stepMinutes` to 60; at most 7 days and 336 buckets. MIG and slot atoms not counted."""
    try:
        window = resolve_window(ctx.now(), body.from_, body.to, body.step_minutes)
    except TimelineError as exc:
        raise InvalidInput(
            str(exc), {"fields": [{"path": exc.field, "message": str(exc), "type": "range"}]}
        ) from None
    rows = (await ctx.ledger.rollup([body.pool_id]))[body.pool_id]
    allocatable = next((r.allocatable for r in rows if r.resource == "gpu"), 0)
    booked = await ctx.ledger.reservations.booked_gpus(body.pool_id, window.start, window.end)
    return {
        "poolId": body.pool_id,
        "from": window.start,
        "to": window.end,
        "stepMinutes": window.step_ms // 60_000,
        "allocatable": allocatable,
        "buckets": [
            {"start": s, "end": e, "booked": n, "free": max(0, allocatable - n)}
            for s, e, n in booked_per_bucket(window, booked)
        ],
    }
