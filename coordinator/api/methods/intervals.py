"""Interval reservations of pool memory, as seed 002 has them:
`POST /api/capacity/reservations`, `GET /api/capacity/reservations`,
`GET /api/capacity/calendar` — declared in the method registry under the `seed-002`
convention.

Unlike the compute methods these answer validation failures with `400` and a plain text
message, `409 {"error": "capacity_not_available", "intervals": [...]}` when it does not
fit and `409 {"error": "idempotency_key_conflict"}` — the seed's shapes (the server maps
`IntervalError`, `NotFound` and `IdempotencyKeyConflict` to them for this convention).
There is no cancel, delete or modify route.
"""

from __future__ import annotations

import re

from coordinator.api.http import render
from coordinator.api.http.auth import may_act_for
from coordinator.api.http.body import BodyError, strict_json
from coordinator.api.http.context import CallContext
from coordinator.api.http.cursor import decode_time_cursor, encode_cursor
from coordinator.api.http.registry import REGISTRY, Reply
from coordinator.api.shapes import interval_outputs as out
from coordinator.api.shapes.base import RestInput, param
from coordinator.domain.errors import CoordinatorError, PermissionDenied
from coordinator.domain.intervals import (
    INTERVAL_MS,
    IntervalError,
    format_time,
    parse_limit,
    parse_window,
)
from coordinator.services.idempotent import Replayed
from coordinator.services.intervals import IntervalsBooked, IntervalsRefused, visible_pool
from shared.ids import IDEMPOTENCY_KEY_PATTERN, TENANT_ID_PATTERN

_KEY = re.compile(IDEMPOTENCY_KEY_PATTERN)
_TENANT = re.compile(TENANT_ID_PATTERN)
TIME = {"type": "string", "format": "date-time"}


class ReserveInput(RestInput):
    idempotency_key: str | None = param(
        "Idempotency-Key",
        "header",
        description="Names this write: a retry with the same key and body gets the first answer.",
    )
    pool_id: str | None = param(
        "poolId", "query", description="The pool; needed when the tenant sees several."
    )
    body: bytes | None = param("body", "body", description="The intervals (JSON).")


class ListInput(RestInput):
    from_: str | None = param(
        "from",
        "query",
        required=True,
        description="RFC 3339: reservations made at or after.",
        schema=TIME,
    )
    to: str | None = param(
        "to",
        "query",
        required=True,
        description="RFC 3339: reservations made before.",
        schema=TIME,
    )
    cursor: str | None = param("cursor", "query", description="The previous page's nextCursor.")
    limit: str | None = param(
        "limit", "query", description="Page size (at most 200).",
        schema={"type": "integer", "minimum": 1},
    )  # fmt: skip


class CalendarInput(RestInput):
    from_: str | None = param(
        "from",
        "query",
        required=True,
        description="RFC 3339, on the 15-minute grid.",
        schema=TIME,
    )
    to: str | None = param(
        "to",
        "query",
        required=True,
        description="RFC 3339, on the grid; at most 35 days on.",
        schema=TIME,
    )
    pool_id: str | None = param(
        "poolId", "query", description="The pool; needed when the tenant sees several."
    )
    tenant_id: str | None = param(
        "tenantId",
        "query",
        description="The tenant whose calendar (default: the key's own); an operator's key "
        "may name any tenant, the console's operator acting for one.",
    )


@REGISTRY.method(
    "intervals.reserve", kind="write", permission="compute:reservations:write",
    scope="caller-tenant", input=ReserveInput, phase="v0.2", convention="seed-002",
    verb="POST", path="/api/capacity/reservations", output=out.IntervalReservationOut,
    body=out.IntervalsRequest,
    conflicts=(out.CapacityNotAvailableBody, out.IdempotencyConflictBody),
)  # fmt: skip
async def reserve(ctx: CallContext, q: ReserveInput) -> out.IntervalReservationOut | Reply:
    """Commit capacity to one or more 15-minute intervals, all or nothing."""
    try:
        body = strict_json(q.body or b"null")
    except BodyError as exc:
        raise IntervalError(str(exc)) from None
    key = q.idempotency_key
    if key is not None and not _KEY.match(key):
        raise IntervalError("Idempotency-Key: at most 128 of A-Z a-z 0-9 . _ : -")
    out = await ctx.services.intervals.book(ctx.principal.tenant_id, body, q.pool_id, key)
    if isinstance(out, Replayed):
        return Reply(out.status, out.body)
    if isinstance(out, IntervalsRefused):
        for reason in sorted({s.reason for s in out.shortfalls}):
            ctx.services.metrics.refused("interval", reason)
        return Reply(409, render.intervals_refused(out.shortfalls))
    assert isinstance(out, IntervalsBooked)
    ctx.services.metrics.booked("interval")
    return render.interval_reservation(out.reservation)


@REGISTRY.method(
    "intervals.list", kind="read", permission="compute:reservations:read",
    scope="caller-tenant", input=ListInput, phase="v0.2", convention="seed-002",
    verb="GET", path="/api/capacity/reservations", output=out.IntervalReservationPage,
)  # fmt: skip
async def list_reservations(ctx: CallContext, q: ListInput) -> out.IntervalReservationPage:
    """The audit list: every interval reservation made in [from, to), newest first."""
    start, end = parse_window(q.from_, q.to, grid=False)
    limit = parse_limit(q.limit)
    before = None
    if q.cursor:
        try:
            before = decode_time_cursor(q.cursor)
        except CoordinatorError:
            raise IntervalError("cursor: not a cursor this server issued") from None
    tenant = ctx.principal.tenant_id
    page = await ctx.ledger.intervals.page(tenant, start, end, before, limit + 1)
    more = len(page) > limit
    page = page[:limit]
    return out.IntervalReservationPage(
        from_=format_time(start),
        to=format_time(end),
        reservations=[render.interval_reservation(r) for r in page],
        next_cursor=encode_cursor([page[-1].created_at, page[-1].reservation_id]) if more else None,
    )


@REGISTRY.method(
    "intervals.calendar", kind="read", permission="compute:reservations:read",
    scope="caller-tenant", input=CalendarInput, phase="v0.2", convention="seed-002",
    verb="GET", path="/api/capacity/calendar", output=out.Calendar,
)  # fmt: skip
async def calendar(ctx: CallContext, inp: CalendarInput) -> out.Calendar:
    """Per quarter-hour of [from, to): the tenant's limit, reserved and reservable GB."""
    start, end = parse_window(inp.from_, inp.to, grid=True)
    tenant = ctx.principal.tenant_id if inp.tenant_id is None else inp.tenant_id
    if not _TENANT.match(tenant):
        raise IntervalError("tenantId: not a tenant id")
    if not may_act_for(ctx.principal, tenant):
        raise PermissionDenied(f"this key may not act for tenant {tenant!r}")
    pool = await visible_pool(ctx.ledger, tenant, inp.pool_id)
    quarters = list(range(start, end, INTERVAL_MS))
    usage = await ctx.ledger.intervals.reservable(tenant, pool.pool_id, quarters)
    return out.Calendar(
        from_=format_time(start),
        to=format_time(end),
        resource="memory_gb",
        intervals=[
            out.CalendarInterval(
                starts_at=format_time(q),
                ends_at=format_time(q + INTERVAL_MS),
                reservation_limit_gb=usage[q].limit_gb,
                reserved_gb=usage[q].tenant_gb,
                reservable_gb=usage[q].reservable,
            )
            for q in quarters
        ],
    )
