"""How the API words values and outcomes: reservations, interval reservations, refusals
and the error envelope. Workflows record these words under idempotency keys through
`RESERVATION_ANSWERS` and `INTERVAL_ANSWERS`, so a replay is exactly the first answer."""

from __future__ import annotations

from typing import Any

from coordinator.domain.intervals import Interval, IntervalReservation, format_time
from coordinator.domain.model import COUNT_COLUMNS, RollupRow
from coordinator.domain.reservation import Reservation
from coordinator.errors import CoordinatorError
from coordinator.services.intervals import Shortfall


def error_body(code: str, message: str, details: Any = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "details": details or {}}}


def rollup_row(row: RollupRow) -> dict[str, int | str]:
    return (
        {"resource": row.resource}
        | {c: getattr(row, c) for c in COUNT_COLUMNS}
        | {"updatedAt": row.updated_at}
    )


def reservation(res: Reservation, now: int) -> dict[str, Any]:
    out: dict[str, Any] = {
        "reservationId": res.reservation_id,
        "tenantId": res.tenant_id,
        "poolId": res.pool_id,
        "state": res.state(now),
        "start": res.start,
        "end": res.end,
        "spot": res.spot,
        "binding": res.binding,
        "atoms": [{"atomId": a.atom_id, "nodeId": a.node_id, "class": a.cls} for a in res.atoms],
        "createdAt": res.created_at,
    }
    if res.project_id:
        out["projectId"] = res.project_id
    if res.lease_expires_at is not None:
        out["leaseExpiresAt"] = res.lease_expires_at
    if res.preempt_at is not None:
        out["preemptAt"] = res.preempt_at
    if res.resources:
        out["resources"] = res.resources
    if res.gang:
        out["gang"] = res.gang
    if res.ended_at is not None:
        out["endedAt"] = res.ended_at
    return out


def interval(iv: Interval) -> dict[str, Any]:
    return {
        "startsAt": format_time(iv.starts_at),
        "endsAt": format_time(iv.ends_at),
        "capacityGb": iv.capacity_gb,
    }


def interval_reservation(res: IntervalReservation) -> dict[str, Any]:
    return {
        "reservationId": res.reservation_id,
        "createdAt": format_time(res.created_at),
        "intervals": [interval(iv) for iv in res.intervals],
    }


def intervals_refused(shortfalls: tuple[Shortfall, ...]) -> dict[str, Any]:
    """Seed 002's 409: every interval that does not fit."""
    return {
        "error": "capacity_not_available",
        "intervals": [
            {
                "startsAt": format_time(s.starts_at),
                "requestedGb": s.requested_gb,
                "reservableGb": s.reservable_gb,
                "reason": s.reason,
            }
            for s in shortfalls
        ],
    }


class ReservationWords:
    """The words workflows record (`ReservationAnswers` and `IntervalAnswers`)."""

    def created(self, res: Reservation, now: int) -> Any:
        return reservation(res, now)

    def refused(self, error: CoordinatorError) -> Any:
        return error_body(error.code, error.message, error.details)


class IntervalWords:
    def booked(self, res: IntervalReservation) -> Any:
        return interval_reservation(res)

    def refused(self, shortfalls: tuple[Shortfall, ...]) -> Any:
        return intervals_refused(shortfalls)


RESERVATION_ANSWERS = ReservationWords()
INTERVAL_ANSWERS = IntervalWords()
