"""Chargeback (SPEC §13, issue 35): reserved capacity consumed by use.

`GET /api/capacity/consumption` answers in seed 002's style and by the calendar's rules
(the same `from`/`to` on the 15-minute grid, at most 35 days, plain-text 400s naming
the field): per quarter, tenant and pool, memory reserved by interval reservations
against memory used, with what was covered, unused and on demand. `usage.consumption`
is the compute method for device bookings: booked GPU-hours used and unused per
reservation, unbooked GPU-hours on demand.

A tenant's key reads its own rows only (another tenantId is 403); an operator or
observer reads any tenant's, or every tenant's with the unattributed use beside them
(`tenantId` null). A read writes nothing.
"""

from __future__ import annotations

import itertools
import re
from decimal import Decimal
from typing import Literal

from pydantic import Field, model_validator

from coordinator.api.http.auth import may_act_for
from coordinator.api.http.context import CallContext
from coordinator.api.http.cursor import decode_cursor, encode_cursor
from coordinator.api.http.registry import REGISTRY, Streamed
from coordinator.api.shapes import consumption_outputs as out
from coordinator.api.shapes.base import ApiInput, RestInput, param
from coordinator.api.shapes.fields import EpochMs, PoolId, TenantId
from coordinator.domain.booked_hours import HOUR_MS
from coordinator.domain.consumption import (
    Consumption,
    gb,
    gb_hours,
    totals,
)
from coordinator.domain.errors import CoordinatorError, InvalidInput, NotFound, PermissionDenied
from coordinator.domain.focus import csv_chunks, memory_rows
from coordinator.domain.focus_devices import device_rows
from coordinator.domain.intervals import (
    INTERVAL_MS,
    MAX_WINDOW_MS,
    IntervalError,
    format_time,
    parse_limit,
    parse_window,
)
from coordinator.services.consumption import (
    device_consumption,
    device_hours,
    memory_consumption,
    memory_export,
    pool_places,
)
from coordinator.services.intervals import visible_pool
from shared.ids import POOL_ID_PATTERN, TENANT_ID_PATTERN

_TENANT = re.compile(TENANT_ID_PATTERN)
_POOL = re.compile(POOL_ID_PATTERN)
TIME = {"type": "string", "format": "date-time"}
# A page holds at most one 35-day window of quarters for one tenant and pool.
DEFAULT_LIMIT = 1000
MAX_LIMIT = MAX_WINDOW_MS // INTERVAL_MS


class ConsumptionInput(RestInput):
    from_: str | None = param(
        "from", "query", required=True, description="RFC 3339, on the 15-minute grid.",
        schema=TIME,
    )  # fmt: skip
    to: str | None = param(
        "to", "query", required=True, description="RFC 3339, on the grid; at most 35 days on.",
        schema=TIME,
    )  # fmt: skip
    tenant_id: str | None = param(
        "tenantId",
        "query",
        description="Only this tenant (a tenant's key: its own, the default); an operator's "
        "or observer's key without it reads every tenant and the unattributed use.",
    )
    pool_id: str | None = param("poolId", "query", description="Only this pool.")
    cursor: str | None = param("cursor", "query", description="The previous page's nextCursor.")
    limit: str | None = param(
        "limit", "query",
        description=f"Rows per page (default {DEFAULT_LIMIT}, at most {MAX_LIMIT}).",
        schema={"type": "integer", "minimum": 1},
    )  # fmt: skip


def _after(raw: str | None) -> tuple[int, str, str] | None:
    """The last row of the previous page: (quarter, tenant, pool)."""
    if not raw:
        return None
    try:
        value = decode_cursor(raw)
    except CoordinatorError:
        value = None
    if (
        isinstance(value, list)
        and len(value) == 3
        and isinstance(value[0], int)
        and not isinstance(value[0], bool)
        and all(isinstance(v, str) and len(v) <= 128 for v in value[1:])
    ):
        return value[0], value[1], value[2]
    raise IntervalError("cursor: not a cursor this server issued")


def _n(value: Decimal) -> float:
    return float(round(value, 6))


def _row(c: Consumption) -> out.ConsumptionRow:
    # A quarter's MiB-ms as GB averaged over it; as GB-hours, a quarter of that.
    return out.ConsumptionRow(
        starts_at=format_time(c.quarter), ends_at=format_time(c.quarter + INTERVAL_MS),
        tenant_id=c.tenant_id or None, pool_id=c.pool_id,
        reserved_gb=_n(gb(c.reserved)), used_gb=_n(gb(c.used)),
        peak_gb=_n(Decimal(c.peak_mib) / 1024), covered_gb=_n(gb(c.covered)),
        unused_gb=_n(gb(c.unused)), on_demand_gb=_n(gb(c.on_demand)),
        reserved_gb_hours=_n(gb_hours(c.reserved)), used_gb_hours=_n(gb_hours(c.used)),
        covered_gb_hours=_n(gb_hours(c.covered)), unused_gb_hours=_n(gb_hours(c.unused)),
        on_demand_gb_hours=_n(gb_hours(c.on_demand)),
    )  # fmt: skip


@REGISTRY.method(
    "capacity.consumption", kind="read", permission="compute:capacity:read",
    scope="caller-tenant", input=ConsumptionInput, phase="v0.4", convention="seed-002",
    verb="GET", path="/api/capacity/consumption", output=out.Consumption,
)  # fmt: skip
async def memory(ctx: CallContext, q: ConsumptionInput) -> out.Consumption:
    """Per quarter-hour of [from, to), tenant and pool: GB reserved, used (time-weighted,
    peak beside it), covered, unused and on demand, in GB and GB-hours."""
    start, end = parse_window(q.from_, q.to, grid=True)
    limit = parse_limit(q.limit, DEFAULT_LIMIT, MAX_LIMIT)
    after = _after(q.cursor)
    p = ctx.principal
    tenant = q.tenant_id
    if tenant is None and not (p.is_operator or p.is_observer):
        tenant = p.tenant_id
    if tenant is not None:
        if not _TENANT.match(tenant):
            raise IntervalError("tenantId: not a tenant id")
        if not may_act_for(p, tenant, "read"):
            raise PermissionDenied(f"this key may not read tenant {tenant!r}")
    if q.pool_id is not None:
        await _pool(ctx, q.pool_id)
    rows = await memory_consumption(ctx.ledger, start, end, tenant, q.pool_id)
    whole = totals(rows)
    if after is not None:
        rows = [r for r in rows if (r.quarter, r.tenant_id, r.pool_id) > after]
    page, more = rows[:limit], len(rows) > limit
    return out.Consumption(
        from_=format_time(start), to=format_time(end), resource="memory_gb",
        intervals=[_row(r) for r in page],
        totals=out.ConsumptionTotals(
            reserved_gb_hours=_n(gb_hours(whole.reserved)), used_gb_hours=_n(gb_hours(whole.used)),
            covered_gb_hours=_n(gb_hours(whole.covered)),
            unused_gb_hours=_n(gb_hours(whole.unused)),
            on_demand_gb_hours=_n(gb_hours(whole.on_demand)),
        ),
        next_cursor=encode_cursor([page[-1].quarter, page[-1].tenant_id, page[-1].pool_id])
        if more else None,
    )  # fmt: skip


async def _pool(ctx: CallContext, pool_id: str) -> None:
    """A pool the key may read: any existing one for an operator or observer, one the
    tenant sees for a tenant (else NOT_FOUND, never a hint that it exists)."""
    p = ctx.principal
    if p.is_operator or p.is_observer:
        if not _POOL.match(pool_id):
            raise IntervalError("poolId: not a pool id")
        if await ctx.ledger.pools.get(pool_id) is None:
            raise NotFound(f"pool {pool_id} not found")
        return
    await visible_pool(ctx.ledger, p.tenant_id, pool_id)


class DeviceConsumptionInput(ApiInput):
    tenant_id: TenantId | None = Field(
        default=None, description="The tenant; absent (operators, observers): every tenant."
    )
    pool_id: PoolId | None = Field(default=None, description="Only this pool.")
    from_: EpochMs = Field(alias="from", description="Window start, ms.")
    to: EpochMs = Field(description="Window end, ms; at most 35 days after from.")

    @model_validator(mode="after")
    def _window(self) -> DeviceConsumptionInput:
        if self.to <= self.from_:
            raise ValueError("to must be after from")
        if self.to - self.from_ > MAX_WINDOW_MS:
            raise ValueError("the window is at most 35 days")
        return self


def _h(unit_ms: int) -> float:
    return round(unit_ms / HOUR_MS, 6)


@REGISTRY.method(
    "usage.consumption", kind="read", permission="compute:capacity:read",
    scope="compute-tenant", input=DeviceConsumptionInput, output=out.DeviceConsumption,
    phase="v0.4",
)  # fmt: skip
async def devices(ctx: CallContext, body: DeviceConsumptionInput) -> out.DeviceConsumption:
    """Per device reservation in [from, to): booked unit-hours split into used (a
    process ran) and unused; and unbooked GPU-hours on demand per tenant and pool (a
    tenant's key: its own; every tenant's read: the unattributed use beside them)."""
    rows, unbooked = await device_consumption(
        ctx.ledger, body.from_, body.to, ctx.now(), body.tenant_id, body.pool_id
    )
    return out.DeviceConsumption(
        from_=body.from_, to=body.to,
        reservations=[
            out.DeviceConsumptionRow(
                reservation_id=r.reservation_id, tenant_id=r.tenant_id, pool_id=r.pool_id,
                project_id=r.project_id, resource=r.resource, booked_hours=_h(r.booked_ms),
                used_hours=_h(r.used_ms - r.idle_ms), idle_hours=_h(r.idle_ms),
                unused_hours=_h(r.booked_ms - r.used_ms + r.idle_ms),
            )
            for r in rows
        ],
        on_demand=[
            out.OnDemandRow(
                tenant_id=u.tenant_id or None, pool_id=u.pool_id, used_hours=_h(u.used_ms)
            )
            for u in unbooked
        ],
    )  # fmt: skip


class ExportInput(ApiInput):
    tenant_id: TenantId | None = Field(
        default=None, description="The tenant; absent (operators, observers): every tenant."
    )
    pool_id: PoolId | None = Field(default=None, description="Only this pool.")
    format: Literal["focus-csv"] = Field(
        default="focus-csv",
        description="FOCUS 1.2 rows as CSV (`gpufleet usage export --format focus-parquet` "
        "writes Parquet from it on the caller's machine).",
    )
    from_: EpochMs = Field(alias="from", description="Window start, ms, on the 15-minute grid.")
    to: EpochMs = Field(description="Window end, ms, on the grid; at most 35 days after from.")


def _window(start: int, end: int) -> None:
    """The calendar's rules for an export window, each failure naming its field."""
    problems = [
        {"path": name, "message": "must be on the 15-minute UTC grid"}
        for name, value in (("from", start), ("to", end))
        if value % INTERVAL_MS
    ]
    if end <= start:
        problems.append({"path": "to", "message": "must be after from"})
    elif end - start > MAX_WINDOW_MS:
        problems.append({"path": "to", "message": "the window is at most 35 days"})
    if problems:
        text = "; ".join(f"{p['path']}: {p['message']}" for p in problems)
        raise InvalidInput(f"invalid input: {text}", {"fields": problems})


@REGISTRY.method(
    "usage.export", kind="read", permission="compute:capacity:read", scope="compute-tenant",
    input=ExportInput, phase="v0.4", streams="text/csv",
)  # fmt: skip
async def export(ctx: CallContext, body: ExportInput) -> Streamed:
    """FOCUS 1.2 rows (CSV, streamed): per interval, memory reserved against used (Used
    and Unused parts of each commitment, use above it on demand); per hour, each device
    reservation's booked time used and unused, and unbooked GPU time on demand; priced
    by the rate card (none: quantities with zero costs)."""
    _window(body.from_, body.to)
    card = ctx.services.rate_card
    rows, commitments = await memory_export(
        ctx.ledger, body.from_, body.to, body.tenant_id, body.pool_id
    )
    places = await pool_places(ctx.ledger, {r.pool_id for r in rows})
    hours = await device_hours(
        ctx.ledger, body.from_, body.to, ctx.now(), body.tenant_id, body.pool_id
    )
    name = f"gpufleet-focus-{format_time(body.from_)}-{format_time(body.to)}.csv".replace(":", "")
    focus = itertools.chain(memory_rows(rows, commitments, places, card), device_rows(hours, card))
    return Streamed("text/csv", name, csv_chunks(focus))
