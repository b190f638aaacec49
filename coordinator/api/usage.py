"""usage.report: unit-hours per tenant, pool, project and resource over a window, from
the bookings as they actually ran (see `domain/usage.py`)."""

from __future__ import annotations

from pydantic import Field, model_validator

from coordinator.api import outputs as out
from coordinator.api.context import CallContext
from coordinator.api.fields import EpochMs, PoolId, ProjectId, TenantId
from coordinator.api.registry import REGISTRY, ApiInput
from coordinator.domain.usage import HOUR_MS, MAX_WINDOW_MS, usage_rows

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
    spans = await ctx.ledger.usage.spans(start, end, body.tenant_id, body.pool_id, body.project_id)
    rows = usage_rows(spans, start, end, now)
    totals: dict[str, float] = {}
    for row in rows:
        totals[row.resource] = totals.get(row.resource, 0.0) + row.hours
    return out.UsageReport(
        from_=start,
        to=end,
        as_of=min(now, end),
        rows=[
            out.UsageRow(
                tenant_id=r.tenant_id,
                pool_id=r.pool_id,
                project_id=r.project_id,
                resource=r.resource,
                hours=round(r.hours, 6),
                reservations=r.reservations,
            )
            for r in rows
        ],
        totals={k: round(v, 6) for k, v in sorted(totals.items())},
    )
