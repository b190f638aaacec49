"""reservations.create/get/list/renew/extend/release: decode, call the reservation workflows
(`services/reservations.py`), render.

create places and books atomically; with `wait.timeoutMs` it waits for capacity to free
up before answering 409. Every answer to a create — a 409 included — is recorded under
the idempotency key and replayed for the same body.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from coordinator.api.http import render
from coordinator.api.http.context import CallContext
from coordinator.api.http.cursor import decode_time_cursor, encode_cursor
from coordinator.api.http.registry import REGISTRY, Reply
from coordinator.api.shapes import outputs as out
from coordinator.api.shapes.base import ApiInput
from coordinator.api.shapes.fields import EpochMs, PoolId, ProjectId, TenantId
from coordinator.api.shapes.reservation_input import ReservationCreateInput
from coordinator.domain.errors import NotFound
from coordinator.ledger import ReservationFilter
from coordinator.services.idempotent import Replayed
from coordinator.services.reservations import Created, CreateRequest
from shared.ids import NODE_ID_PATTERN, RESERVATION_ID_PATTERN
from shared.reservation_states import RESERVATION_STATES, ReservationState

ReservationId = Annotated[str, Field(max_length=57, pattern=RESERVATION_ID_PATTERN)]
NodeId = Annotated[str, Field(max_length=128, pattern=NODE_ID_PATTERN)]


class ReservationRef(ApiInput):
    tenant_id: TenantId = Field(description="The reservation's tenant.")
    reservation_id: ReservationId = Field(
        description="The reservation.", examples=["rsv_01hzy3k4m5n6p7q8r9s0t1v2w3"]
    )


class ReservationLookup(ApiInput):
    tenant_id: TenantId | None = Field(
        default=None, description="The reservation's tenant; absent (operators only): any."
    )
    reservation_id: ReservationId = Field(
        description="The reservation.", examples=["rsv_01hzy3k4m5n6p7q8r9s0t1v2w3"]
    )


class RenewInput(ApiInput):
    tenant_id: TenantId = Field(description="The reservation's tenant.")
    reservation_id: ReservationId = Field(
        description="The leased reservation.", examples=["rsv_01hzy3k4m5n6p7q8r9s0t1v2w3"]
    )
    lease_seconds: Annotated[int, Field(ge=30, le=86400)] | None = Field(
        default=None, description="A new lease length (default: its own)."
    )


class ExtendInput(ApiInput):
    tenant_id: TenantId = Field(description="The reservation's tenant.")
    reservation_id: ReservationId = Field(
        description="The live reservation.", examples=["rsv_01hzy3k4m5n6p7q8r9s0t1v2w3"]
    )
    end: EpochMs = Field(
        description="Its new end: whole seconds after its start, after now; later than its"
        " end (the same devices must be free, within quota) or earlier (never past now)."
    )
    dry_run: bool = Field(default=False, description="Decide, and change nothing.")


class ListInput(ApiInput):
    tenant_id: TenantId | None = Field(
        default=None, description="The tenant; absent (operators only): every tenant's."
    )
    pool_id: PoolId | None = Field(default=None, description="Only this pool's.")
    project_id: ProjectId | None = Field(default=None, description="Only this project's.")
    node_id: NodeId | None = Field(
        default=None,
        description="Only those booked on this node (what maintenance of it would put at risk).",
    )
    state: Annotated[list[ReservationState], Field(max_length=len(RESERVATION_STATES))] = Field(
        default_factory=list, description="Any of these states, as of now (empty: every state)."
    )
    from_: EpochMs | None = Field(
        default=None, alias="from", description="Only those whose time overlaps [from, to)."
    )
    to: EpochMs | None = Field(default=None, description="See from.")
    cursor: Annotated[str, Field(max_length=512)] | None = Field(
        default=None, description="The previous page's nextCursor."
    )
    limit: Annotated[int, Field(ge=1, le=200)] = Field(default=50, description="Page size.")

    @model_validator(mode="after")
    def _window(self) -> ListInput:
        if self.from_ is not None and self.to is not None and self.to <= self.from_:
            raise ValueError("to must be after from")
        return self


@REGISTRY.method(
    "reservations.create", kind="write", permission="compute:reservations:write",
    scope="compute-pool", input=ReservationCreateInput, output=out.ReservationOut,
    phase="v0.2",
)  # fmt: skip
async def create(ctx: CallContext, body: ReservationCreateInput) -> out.ReservationOut | Reply:
    """Place and book a request atomically across every atom and gang member.

    Idempotent per idempotencyKey; QUOTA_EXCEEDED over quota; 409 CAPACITY_NOT_AVAILABLE
    with, per device request, what was asked, what could be had and why."""
    out = await ctx.services.reservations.create(create_request(body))
    if isinstance(out, Created):
        ctx.services.metrics.booked("reservation")
        return render.reservation(out.reservation, out.at, out.warnings)
    if isinstance(out, Replayed):
        return Reply(out.status, out.body)
    ctx.services.metrics.refused("reservation", out.error.code)
    return Reply(out.error.status, render.RESERVATION_ANSWERS.refused(out.error))


@REGISTRY.method(
    "reservations.get", kind="read", permission="compute:reservations:read",
    scope="compute-tenant", input=ReservationLookup, output=out.ReservationOut, phase="v0.2",
)  # fmt: skip
async def get(ctx: CallContext, body: ReservationLookup) -> out.ReservationOut:
    """One of the tenant's reservations, with its state now (operators: any tenant's)."""
    res = await ctx.ledger.reservations.get(body.reservation_id, body.tenant_id)
    idle = ctx.services.idle_since(res.reservation_id)
    return render.reservation(res, ctx.now(), idle_since=idle)


@REGISTRY.method(
    "reservations.list", kind="read", permission="compute:reservations:read",
    scope="compute-tenant", input=ListInput, output=out.ReservationPage, phase="v0.2",
)  # fmt: skip
async def list_(ctx: CallContext, body: ListInput) -> out.ReservationPage:
    """The tenant's reservations, newest first, a page at a time (opaque cursor);
    filtered by pool, project, node, state now and a time window; operators may leave
    out tenantId for every tenant's."""
    if body.pool_id is not None and body.tenant_id is not None:
        pool = await ctx.ledger.pools.get(body.pool_id)
        if pool is None or not pool.visible_to(body.tenant_id):
            raise NotFound(f"pool {body.pool_id} not found")
    before = decode_time_cursor(body.cursor) if body.cursor else None
    now = ctx.now()
    wanted = ReservationFilter(
        tenant_id=body.tenant_id, pool_id=body.pool_id, project_id=body.project_id,
        node_id=body.node_id, states=tuple(body.state), start=body.from_, end=body.to,
    )  # fmt: skip
    page = await ctx.ledger.listing.page(wanted, before, body.limit + 1, now)
    more = len(page) > body.limit
    page = page[: body.limit]
    return out.ReservationPage(
        reservations=[
            render.reservation(r, now, idle_since=ctx.services.idle_since(r.reservation_id))
            for r in page
        ],
        next_cursor=encode_cursor([page[-1].created_at, page[-1].reservation_id])
        if more and page
        else None,
    )


@REGISTRY.method(
    "reservations.renew", kind="write", permission="compute:reservations:write",
    scope="compute-tenant", input=RenewInput, output=out.ReservationOut, phase="v0.2",
)  # fmt: skip
async def renew(ctx: CallContext, body: RenewInput) -> out.ReservationOut:
    """Extend a leased reservation's lease from now (by its leaseSeconds, or a new one)."""
    out = await ctx.services.reservations.renew(
        body.tenant_id, body.reservation_id, body.lease_seconds
    )
    return render.reservation(out.reservation, out.at)


@REGISTRY.method(
    "reservations.extend", kind="write", permission="compute:reservations:write",
    scope="compute-tenant", input=ExtendInput, output=out.ExtendedReservation, phase="v0.2",
)  # fmt: skip
async def extend(ctx: CallContext, body: ExtendInput) -> out.ExtendedReservation:
    """Move a live reservation's end, keeping its devices: later only where those same
    devices are free for the added time and in service now, as a create would take them
    (409 CAPACITY_NOT_AVAILABLE naming what blocks them: booked then, its node out of
    service, the device unhealthy) and its quotas have room (409 QUOTA_EXCEEDED);
    earlier, never past now. The same end again changes nothing; dryRun decides and
    changes nothing."""
    moved = await ctx.services.reservations.extend(
        body.tenant_id, body.reservation_id, body.end, dry_run=body.dry_run
    )
    shown = render.reservation(moved.reservation, moved.at)
    return out.ExtendedReservation(
        **dict(shown), previous_end=moved.previous_end, dry_run=body.dry_run
    )


@REGISTRY.method(
    "reservations.release", kind="write", permission="compute:reservations:write",
    scope="compute-tenant", input=ReservationRef, output=out.ReservationOut, phase="v0.2",
)  # fmt: skip
async def release(ctx: CallContext, body: ReservationRef) -> out.ReservationOut:
    """End a reservation now; the rest of its time is free at once (rollup included)."""
    out = await ctx.services.reservations.release(body.tenant_id, body.reservation_id)
    return render.reservation(out.reservation, out.at)


def create_request(body: ReservationCreateInput) -> CreateRequest:
    """What a decoded create body asks of the reservation workflow."""
    return CreateRequest(
        tenant_id=body.tenant_id,
        pool_id=body.pool_id,
        project_id=body.project_id,
        placement=body.placement(),
        start=body.start,
        duration_ms=body.duration_ms,
        lease_seconds=body.lease_seconds,
        resources=body.resources.as_dict() if body.resources else {},
        gang=body.gang.model_dump(by_alias=True, exclude_none=True) if body.gang else None,
        idempotency_key=body.idempotency_key,
        canonical=body.canonical(),
        wait_ms=body.wait.timeout_ms if body.wait else 0,
    )
