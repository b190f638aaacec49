"""capacity.summary, byPool, preview and timeline, exactly as seed 000 describes them.

Both read the stored per-pool rollup. `byGpuModel` sums only each pool's `gpu` row, and
pools without a GPU model count under `other`; in capacity.fleet such a pool's own
`gpuModels` splits its GPUs by the model its agents report (read from its atoms and
bookings at the time, so only the operator's fleet view pays for it).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from coordinator.api.http import render
from coordinator.api.http.context import CallContext
from coordinator.api.http.registry import REGISTRY
from coordinator.api.shapes import outputs as out
from coordinator.api.shapes.base import ApiInput
from coordinator.api.shapes.fields import EpochMs, PoolId, TenantId
from coordinator.api.shapes.reservation_input import ReservationCreateInput
from coordinator.domain.errors import InvalidInput
from coordinator.domain.model import Pool, RollupRow
from coordinator.domain.placement_model import NodePick, Shortfall
from coordinator.domain.rollup import sum_rows
from coordinator.domain.timeline import TimelineError, booked_per_bucket, resolve_window
from coordinator.services.reservations import resolve_start


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


@REGISTRY.method(
    "capacity.summary",
    kind="read",
    permission="compute:capacity:read",
    scope="compute-tenant",
    input=SummaryInput,
    output=out.CapacitySummary,
    phase="v0.1",
)
async def summary(ctx: CallContext, body: SummaryInput) -> out.CapacitySummary:
    """Every pool the tenant owns or is offered with its rollup rows, plus whole-GPU
    totals per GPU model.

    Archived pools appear only for their owner."""
    pools = await ctx.ledger.pools.list_visible(body.tenant_id)
    return await _pools_capacity(ctx, body.tenant_id, pools)


@REGISTRY.method(
    "capacity.fleet", kind="read", permission="platform:admin", scope="platform",
    input=FleetInput, output=out.CapacitySummary, phase="v0.3",
)  # fmt: skip
async def fleet(ctx: CallContext, body: FleetInput) -> out.CapacitySummary:
    """capacity.summary over every pool of every tenant, archived ones included (operator)."""
    return await _pools_capacity(ctx, None, await ctx.ledger.pools.list_all(), per_model=True)


async def _pools_capacity(
    ctx: CallContext, tenant_id: str | None, pools: list[Pool], per_model: bool = False
) -> out.CapacitySummary:
    rows = await ctx.ledger.rollup(p.pool_id for p in pools)
    gpu_rows: dict[str, list[RollupRow]] = {}
    for pool in pools:
        for row in rows[pool.pool_id]:
            if row.resource == "gpu":
                gpu_rows.setdefault(pool.gpu_model or "other", []).append(row)
    by_model: dict[str, out.ModelTotals] = {}
    for model, model_rows in sorted(gpu_rows.items()):
        total = sum_rows(model_rows, "gpu")
        by_model[model] = out.ModelTotals(
            total=total.total, allocatable=total.allocatable, allocated=total.allocated,
            reserved=total.reserved, available=total.available,
        )  # fmt: skip
    busy = await _unbooked_busy(ctx, [p.pool_id for p in pools])
    # The fleet view (an operator's): a mixed pool's GPUs per reported model, an A100
    # and an L40S not one `other`. Read from atoms and bookings, not the stored rollup,
    # so the tenants' hot capacity.summary leaves it out.
    split = [p.pool_id for p in pools if not p.gpu_model] if per_model else []
    mixed = await ctx.ledger.gpu_models(split, ctx.now())
    return out.CapacitySummary(
        tenant_id=tenant_id,
        pools=[
            out.PoolCapacity(
                pool_id=p.pool_id,
                name=p.name,
                gpu_model=p.gpu_model,
                owner=p.owner,
                archived=p.archived,
                capacity=[render.rollup_row(r) for r in rows[p.pool_id]],
                unbooked_busy=busy.get(p.pool_id),
                gpu_models=None
                if p.pool_id not in mixed
                else {m: out.ModelTotals(**cols) for m, cols in mixed[p.pool_id].items()},
            )
            for p in pools
        ],
        by_gpu_model=by_model,
    )


@REGISTRY.method(
    "capacity.byPool",
    kind="read",
    permission="compute:capacity:read",
    scope="compute-pool",
    input=ByPoolInput,
    output=out.PoolRows,
    phase="v0.2",
)
async def by_pool(ctx: CallContext, body: ByPoolInput) -> out.PoolRows:
    """One pool's rollup rows, one per resource, ordered by resource name.

    NOT_FOUND when the pool is not owned by or offered to the tenant, or is archived and
    the tenant is not its owner."""
    pool = ctx.require_pool()
    rows = (await ctx.ledger.rollup([pool.pool_id]))[pool.pool_id]
    busy = await _unbooked_busy(ctx, [pool.pool_id])
    return out.PoolRows(
        pool_id=pool.pool_id,
        rows=[render.rollup_row(r) for r in rows],
        unbooked_busy=busy.get(pool.pool_id),
    )


async def _unbooked_busy(ctx: CallContext, pool_ids: list[str]) -> dict[str, int]:
    """Pool → how many of its allocatable GPUs are in unbooked use, for the pools that
    have any (only pools with a node in unbooked use are read)."""
    busy = ctx.services.busy()
    if not busy:
        return {}
    pool_of = {n.node_id: n.pool_id for n in ctx.services.gpu_use}
    wanted = set(pool_ids)
    out: dict[str, int] = {}
    for pool_id in sorted({pool_of.get(node_id, "") for node_id, _ in busy} & wanted):
        count = await ctx.ledger.bookings.unbooked_busy(pool_id, busy, ctx.now())
        if count:
            out[pool_id] = count
    return out


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


def _candidate(pick: NodePick) -> out.Candidate:
    # A candidate atom's attributes are extra fields, inline beside its id and class.
    atoms = [out.CandidateAtom(atom_id=a.atom_id, cls=a.cls, **a.attrs) for a in pick.atoms]
    return out.Candidate(node_id=pick.node_id, atoms=atoms, score=pick.score)


def _shortfall(s: Shortfall) -> out.DeviceShortfall:
    return out.DeviceShortfall(
        index=s.index, cls=s.cls, requested=s.requested, available=s.available, reason=s.reason
    )


@REGISTRY.method(
    "capacity.preview", kind="read", permission="compute:capacity:read",
    scope="compute-pool", input=PreviewInput, output=out.Preview, phase="v0.2",
)  # fmt: skip
async def preview(ctx: CallContext, body: PreviewInput) -> out.Preview:
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
        ctx.services.notice_ms, ctx.services.busy(),
    )  # fmt: skip
    placement, preemptible = preview.placement, preview.preemptible
    fits = placement.fits
    return out.Preview(
        fits=fits,
        candidates=[_candidate(p) for p in placement.candidates],
        reason=None if fits else placement.reason,
        shortfalls=None if fits else [_shortfall(s) for s in placement.shortfalls],
        filtered=None if fits else dict(sorted(placement.filtered.items())),
        preemptible=out.Preemptible(count=preemptible.count, starts_at=preemptible.starts_at)
        if preemptible is not None
        else None,
        warnings=list(preview.warnings) or None,
    )


@REGISTRY.method(
    "capacity.timeline", kind="read", permission="compute:capacity:read",
    scope="compute-pool", input=TimelineInput, output=out.Timeline, phase="v0.2",
)  # fmt: skip
async def timeline(ctx: CallContext, body: TimelineInput) -> out.Timeline:
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
    return out.Timeline(
        pool_id=body.pool_id,
        from_=window.start,
        to=window.end,
        step_minutes=window.step_ms // 60_000,
        allocatable=allocatable,
        buckets=[
            out.TimelineBucket(start=s, end=e, booked=n, free=max(0, allocatable - n))
            for s, e, n in booked_per_bucket(window, booked)
        ],
    )
