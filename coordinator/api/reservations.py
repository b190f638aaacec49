"""reservations.create/get/list/renew/release.

create places and books atomically (see `ledger/bookings.py`); with `wait.timeoutMs` it
waits for capacity to free up before answering 409. Every answer to a create — a 409
included — is recorded under the idempotency key and replayed for the same body.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from pydantic import Field

from coordinator.api.context import CallContext
from coordinator.api.cursor import decode_cursor, encode_cursor
from coordinator.api.fields import PoolId, TenantId
from coordinator.api.registry import REGISTRY, ApiInput, Reply
from coordinator.api.reservation_input import ReservationCreateInput
from coordinator.domain.placement import Placement
from coordinator.domain.reservation import Reservation
from coordinator.errors import CapacityNotAvailable, InvalidInput, QuotaExceeded
from coordinator.ledger import idempotency
from coordinator.ledger.bookings import ENDPOINT, Booked, BookingRequest, NotPlaced
from shared.ids import RESERVATION_ID_PATTERN, ulid
from shared.wire import Alert

ReservationId = Annotated[str, Field(max_length=57, pattern=RESERVATION_ID_PATTERN)]
# A start this far in the past is a clock problem on the client, not "now".
START_SKEW_MS = 5 * 60 * 1000


class ReservationRef(ApiInput):
    tenant_id: TenantId
    reservation_id: ReservationId


class RenewInput(ApiInput):
    tenant_id: TenantId
    reservation_id: ReservationId
    lease_seconds: Annotated[int, Field(ge=30, le=86400)] | None = None


class ListInput(ApiInput):
    tenant_id: TenantId
    pool_id: PoolId | None = None
    cursor: Annotated[str, Field(max_length=512)] | None = None
    limit: Annotated[int, Field(ge=1, le=200)] = 50


def resolve_start(body: ReservationCreateInput, now: int) -> int:
    if body.start is None:
        return now
    if body.start < now - START_SKEW_MS:
        raise InvalidInput(
            "start is in the past",
            {"fields": [{"path": "start", "message": "start is in the past", "type": "past"}]},
        )
    return max(body.start, now)


def shortfall_details(placement: Placement) -> dict[str, Any]:
    return {
        "reason": placement.reason,
        "devices": [
            {
                "index": s.index,
                "class": s.cls,
                "requested": s.requested,
                "available": s.available,
                "reason": s.reason,
            }
            for s in placement.shortfalls
        ],
    }


def _not_available(out: NotPlaced) -> dict[str, Any]:
    details = shortfall_details(out.placement)
    message = out.placement.reason or "the request does not fit"
    if out.preemptible:
        details["preemptible"] = {"count": out.preemptible[0], "startsAt": out.preemptible[1]}
    return {"error": {"code": CapacityNotAvailable.code, "message": message, "details": details}}


async def _notify_victims(ctx: CallContext, victims: tuple[Reservation, ...], now: int) -> None:
    for victim in victims:
        node_id = victim.atoms[0].node_id if victim.atoms else "-"
        await ctx.services.alerts.publish(
            Alert(
                alert_id=ulid(now),
                kind="reservation.notice",
                pool_id=victim.pool_id,
                node_id=node_id,
                at=now,
                reason="preempted by a regular reservation",
                since=now,
                reservation_id=victim.reservation_id,
                details={"tenantId": victim.tenant_id, "preemptAt": victim.preempt_at},
            )
        )


@REGISTRY.method(
    "reservations.create", kind="write", permission="compute:reservations:write",
    scope="compute-pool", input=ReservationCreateInput, phase="v0.2",
)  # fmt: skip
async def create(ctx: CallContext, body: ReservationCreateInput) -> Any:
    """Place and book a request atomically across every atom and gang member.

    Idempotent per idempotencyKey; QUOTA_EXCEEDED over quota; 409 CAPACITY_NOT_AVAILABLE
    with, per device request, what was asked, what could be had and why."""
    now = ctx.now()
    digest = idempotency.body_hash(body.canonical())
    placement = body.placement()

    def request_at(at: int) -> BookingRequest:
        # Recomputed for every attempt: a request that waited starts when it is placed.
        return BookingRequest(
            tenant_id=body.tenant_id,
            pool_id=body.pool_id,
            project_id=body.project_id,
            placement=placement,
            start=resolve_start(body, at),
            duration_ms=body.duration_ms,
            lease_seconds=body.lease_seconds,
            resources=body.resources.as_dict() if body.resources else {},
            gang=body.gang.model_dump(by_alias=True, exclude_none=True) if body.gang else None,
            idempotency_key=body.idempotency_key,
            digest=digest,
            notice_ms=ctx.services.notice_ms,
        )

    request = request_at(now)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + (body.wait.timeout_ms / 1000 if body.wait else 0)
    while True:
        attempt_at = ctx.now()
        request = request_at(attempt_at)
        try:
            out = await ctx.ledger.bookings.create(request, attempt_at)
        except QuotaExceeded as exc:
            error = {"error": {"code": exc.code, "message": exc.message, "details": exc.details}}
            recorded = await idempotency.record_once(
                ctx.ledger.db, body.tenant_id, ENDPOINT, body.idempotency_key,
                request.digest, exc.status, error, ctx.now(),
            )  # fmt: skip
            return Reply(recorded.status, recorded.response)
        if isinstance(out, idempotency.Recorded):
            return Reply(out.status, out.response)
        if isinstance(out, Booked):
            await _notify_victims(ctx, out.victims, ctx.now())
            return out.reservation.to_api(ctx.now())
        remaining = deadline - loop.time()
        if remaining > 0:
            await ctx.services.capacity.wait(min(remaining, 1.0))
            continue
        recorded = await idempotency.record_once(
            ctx.ledger.db, body.tenant_id, ENDPOINT, body.idempotency_key, request.digest,
            CapacityNotAvailable.status, _not_available(out), ctx.now(),
        )  # fmt: skip
        return Reply(recorded.status, recorded.response)


@REGISTRY.method(
    "reservations.get", kind="read", permission="compute:reservations:read",
    scope="compute-tenant", input=ReservationRef, phase="v0.2",
)  # fmt: skip
async def get(ctx: CallContext, body: ReservationRef) -> dict[str, Any]:
    """One of the tenant's reservations, with its state now."""
    res = await ctx.ledger.reservations.get(body.reservation_id, body.tenant_id)
    return res.to_api(ctx.now())


@REGISTRY.method(
    "reservations.list", kind="read", permission="compute:reservations:read",
    scope="compute-tenant", input=ListInput, phase="v0.2",
)  # fmt: skip
async def list_(ctx: CallContext, body: ListInput) -> dict[str, Any]:
    """The tenant's reservations, newest first, a page at a time (opaque cursor)."""
    before = None
    if body.cursor:
        raw = decode_cursor(body.cursor)
        if not (isinstance(raw, list) and len(raw) == 2 and isinstance(raw[0], int)):
            raise InvalidInput("invalid cursor", {"fields": [{"path": "cursor", "message": "bad"}]})
        before = (raw[0], str(raw[1]))
    page = await ctx.ledger.reservations.page(body.tenant_id, body.pool_id, before, body.limit + 1)
    more = len(page) > body.limit
    page = page[: body.limit]
    now = ctx.now()
    return {
        "reservations": [r.to_api(now) for r in page],
        "nextCursor": encode_cursor([page[-1].created_at, page[-1].reservation_id])
        if more and page
        else None,
    }


@REGISTRY.method(
    "reservations.renew", kind="write", permission="compute:reservations:write",
    scope="compute-tenant", input=RenewInput, phase="v0.2",
)  # fmt: skip
async def renew(ctx: CallContext, body: RenewInput) -> dict[str, Any]:
    """Extend a leased reservation's lease from now (by its leaseSeconds, or a new one)."""
    now = ctx.now()
    res = await ctx.ledger.reservations.renew(
        body.reservation_id, body.tenant_id, body.lease_seconds, now
    )
    if res is None:
        raise InvalidInput(
            "the reservation has no lease or is no longer live",
            {"fields": [{"path": "reservationId", "message": "not renewable", "type": "state"}]},
        )
    return res.to_api(now)


@REGISTRY.method(
    "reservations.release", kind="write", permission="compute:reservations:write",
    scope="compute-tenant", input=ReservationRef, phase="v0.2",
)  # fmt: skip
async def release(ctx: CallContext, body: ReservationRef) -> dict[str, Any]:
    """End a reservation now; the rest of its time is free at once (rollup included)."""
    now = ctx.now()
    res = await ctx.ledger.reservations.release(body.reservation_id, body.tenant_id, now)
    ctx.services.capacity.notify()
    return res.to_api(now)
