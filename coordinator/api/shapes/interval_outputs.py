"""Models of seed 002's interval API bodies: the request a reservation POSTs (for the
document; the handler checks the seed's rules in its own words), its answers and the
seed's two 409 bodies. RFC 3339 times, integer GB."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from coordinator.api.shapes.base import ApiOutput
from coordinator.api.shapes.fields import PoolId

Rfc3339 = Annotated[
    str,
    Field(
        description="An RFC 3339 time with an offset; answers are in UTC (`Z`).",
        examples=["2030-01-01T02:00:00Z"],
    ),
]
Gb = Annotated[int, Field(ge=0, description="Memory, in GB.", examples=[16])]


class IntervalOut(ApiOutput):
    starts_at: Rfc3339 = Field(description="Start: on the 15-minute UTC grid.")
    ends_at: Rfc3339 = Field(
        description="End: startsAt + 15 minutes.", examples=["2030-01-01T02:15:00Z"]
    )
    capacity_gb: Gb = Field(description="GB committed: a positive multiple of 4.")


class IntervalsRequest(ApiOutput):
    """The body of `POST /api/capacity/reservations`."""

    intervals: Annotated[list[IntervalOut], Field(min_length=1, max_length=672)] = Field(
        description="The intervals, all or none; at most 672 (a week)."
    )
    pool_id: PoolId | None = Field(
        default=None, description="The pool (also a query parameter); needed if several."
    )


class IntervalReservationOut(ApiOutput):
    reservation_id: str = Field(description="The reservation's id.")
    created_at: Rfc3339 = Field(description="When it was made.")
    intervals: list[IntervalOut] = Field(description="Its intervals, by start.")


class IntervalReservationPage(ApiOutput):
    from_: Rfc3339 = Field(alias="from", description="The window's start (createdAt >= from).")
    to: Rfc3339 = Field(description="The window's end (createdAt < to).")
    reservations: list[IntervalReservationOut] = Field(description="This page, newest first.")
    next_cursor: str | None = Field(
        description="Pass as `cursor` for the next page; null on the last page.",
        examples=[None],
    )


class CalendarInterval(ApiOutput):
    starts_at: Rfc3339 = Field(description="The quarter-hour's start.")
    ends_at: Rfc3339 = Field(description="Its end.", examples=["2030-01-01T02:15:00Z"])
    reservation_limit_gb: Gb = Field(description="The tenant's limit (max_memory_gb).")
    reserved_gb: Gb = Field(description="What the tenant has reserved then.")
    reservable_gb: Gb = Field(description="What one more request may take then.")


class Calendar(ApiOutput):
    from_: Rfc3339 = Field(alias="from", description="The window's start.")
    to: Rfc3339 = Field(description="The window's end.")
    resource: Literal["memory_gb"] = Field(description="What is counted.")
    intervals: list[CalendarInterval] = Field(description="Every quarter-hour of the window.")


class IntervalShortfall(ApiOutput):
    starts_at: Rfc3339 = Field(description="The interval that does not fit.")
    requested_gb: Gb = Field(description="What was asked for.")
    reservable_gb: Gb = Field(description="What it could take.")
    reason: Literal["insufficient_capacity", "concurrent_write"] = Field(
        description="insufficient_capacity: over reservableGb; concurrent_write: another "
        "reservation committed first, retry with the new reservableGb."
    )


class CapacityNotAvailableBody(ApiOutput):
    """Seed 002's 409 when a well-formed request does not fit: every interval that
    does not, so the client can retry in one round trip."""

    error: Literal["capacity_not_available"] = Field(description="The seed's error word.")
    intervals: list[IntervalShortfall] = Field(description="Every interval that does not fit.")


class IdempotencyConflictBody(ApiOutput):
    """Seed 002's 409 when an Idempotency-Key is reused with another body."""

    error: Literal["idempotency_key_conflict"] = Field(description="The seed's error word.")
    message: str = Field(description="What went wrong, for a person.")
