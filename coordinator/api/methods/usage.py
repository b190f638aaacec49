"""usage.report: unit-hours per tenant, pool, project and resource over a window, from
the bookings as they actually ran (see `domain/booked_hours.py`), and beside the GPU classes'
booked hours, the hours they were used and those weighted by utilization
(`domain/gpu_use_report.py`), per reservation on request, and use no booking covered."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import Field, model_validator

from coordinator.api.http.context import CallContext
from coordinator.api.http.registry import REGISTRY
from coordinator.api.shapes import outputs as out
from coordinator.api.shapes.base import ApiInput
from coordinator.api.shapes.fields import EpochMs, PoolId, ProjectId, TenantId
from coordinator.domain.booked_hours import HOUR_MS, MAX_WINDOW_MS, UsageRow, usage_rows
from coordinator.domain.gpu_use_report import reservation_use, use_totals
from coordinator.domain.gpu_use_units import COVERING_CLASSES

DEFAULT_WINDOW_MS = 30 * 24 * HOUR_MS


class UsageInput(ApiInput):
    tenant_id: TenantId | None = Field(
        default=None, description="The tenant; absent (operators only): every tenant."
    )
    pool_id: PoolId | None = Field(default=None, description="Only this pool.")
    project_id: ProjectId | None = Field(default=None, description="Only this project.")
    from_: EpochMs | None = Field(
        default=None, alias="from", description="Window start (default: 30 days before to)."
    )
    to: EpochMs | None = Field(default=None, description="Window end (default: now).")
    by_reservation: bool = Field(
        default=False, description="Also list each reservation's booked, used and weighted hours."
    )

    @model_validator(mode="after")
    def _window(self) -> UsageInput:
        if self.from_ is not None and self.to is not None:
            if self.to <= self.from_:
                raise ValueError("to must be after from")
            if self.to - self.from_ > MAX_WINDOW_MS:
                raise ValueError("the window is at most 366 days")
        return self


@REGISTRY.method(
    "usage.report", kind="read", permission="compute:capacity:read", scope="compute-tenant",
    input=UsageInput, output=out.UsageReport, phase="v0.3",
)  # fmt: skip
async def report(ctx: CallContext, body: UsageInput) -> out.UsageReport:
    """Unit-hours (GPU-hours for `gpu`; MIG, slot, VF, disk and node hours; vCPU- and
    GiB-hours for scalars) per tenant, pool, project and resource over [from, to).

    Counted from the bookings as they ran: a release counts only the time before it, a
    preemption only the time before preemptAt, nothing after now. `to` defaults to now,
    `from` to 30 days before `to`; at most 366 days. Operators may leave out tenantId."""
    now = ctx.now()
    end = body.to if body.to is not None else now
    start = body.from_ if body.from_ is not None else max(0, end - DEFAULT_WINDOW_MS)
    if end - start > MAX_WINDOW_MS:
        start = end - MAX_WINDOW_MS
    # The bookings of every hour the window touches: a use bucket the window cuts counts
    # by its reservation's booked time in that hour (`domain/gpu_use_report.py`).
    spans = await ctx.ledger.booked_spans.spans(
        start - start % HOUR_MS, -(-end // HOUR_MS) * HOUR_MS,
        body.tenant_id, body.pool_id, body.project_id,
    )  # fmt: skip
    rows = usage_rows(spans, start, end, now)
    buckets = await ctx.ledger.gpu_use.summed(
        start, min(end, now), body.tenant_id, body.pool_id, body.project_id
    )
    gpu_spans = [s for s in spans if s.resource in COVERING_CLASSES]
    per_rsv, unbooked = reservation_use(gpu_spans, buckets, start, end, now)
    used = use_totals(per_rsv)
    totals: dict[str, float] = {}
    used_totals: dict[str, float] = {}
    weighted_totals: dict[str, float | None] = {}
    out_rows = []
    for r in rows:
        totals[r.resource] = totals.get(r.resource, 0.0) + r.hours
        out_rows.append(_row(r, used))
        if r.resource in COVERING_CLASSES:
            u, w = used.get((r.tenant_id, r.pool_id, r.project_id or "", r.resource), (0, 0))
            used_totals[r.resource] = used_totals.get(r.resource, 0.0) + u / HOUR_MS
            before = weighted_totals.get(r.resource, 0.0)
            weighted_totals[r.resource] = (
                None if before is None or w is None else before + w / HOUR_MS
            )
    return out.UsageReport(
        from_=start,
        to=end,
        as_of=min(now, end),
        rows=out_rows,
        totals=_rounded(totals),
        used_totals=_rounded(used_totals),
        weighted_totals={
            k: None if v is None else round(v, 6) for k, v in sorted(weighted_totals.items())
        },
        by_reservation=[
            out.UsageReservationRow(
                reservation_id=u.reservation_id, tenant_id=u.tenant_id, pool_id=u.pool_id,
                project_id=u.project_id, resource=u.resource,
                hours=_h(u.booked_ms), used_hours=_h(u.used_ms), weighted_hours=_wh(u.weighted_ms),
                efficiency=round(u.used_ms / u.booked_ms, 4) if u.booked_ms else None,
            )
            for u in per_rsv
        ]
        if body.by_reservation
        else [],
        unbooked=[
            out.UnbookedUseRow(
                pool_id=u.pool_id, tenant_id=u.tenant_id or None, used_hours=_h(u.used_ms),
                weighted_hours=_wh(u.weighted_ms),
            )
            for u in unbooked
        ]
        if body.tenant_id is None and body.project_id is None
        else [],
    )  # fmt: skip


def _h(unit_ms: int) -> float:
    return round(unit_ms / HOUR_MS, 6)


def _wh(unit_ms: int | None) -> float | None:
    """Weighted hours: None where no utilization figure exists (MIG), never 0."""
    return None if unit_ms is None else _h(unit_ms)


def _rounded(totals: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 6) for k, v in sorted(totals.items())}


def _row(
    r: UsageRow, used: Mapping[tuple[str, str, str, str], tuple[int, int | None]]
) -> out.UsageRow:
    gpu = r.resource in COVERING_CLASSES
    u, w = used.get((r.tenant_id, r.pool_id, r.project_id or "", r.resource), (0, 0))
    return out.UsageRow(
        tenant_id=r.tenant_id,
        pool_id=r.pool_id,
        project_id=r.project_id,
        resource=r.resource,
        hours=round(r.hours, 6),
        reservations=r.reservations,
        used_hours=_h(u) if gpu else None,
        weighted_hours=_wh(w) if gpu else None,
        efficiency=round(u / r.unit_ms, 4) if gpu and r.unit_ms else None,
    )
