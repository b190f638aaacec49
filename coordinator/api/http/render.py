"""How the API words values and outcomes: reservations, interval reservations, refusals
and the error envelope. Each answer is built as its output model (`outputs.py`,
`interval_outputs.py`), the one declaration of its shape, and dumped by its aliases
(`registry.dump`); optional fields that do not apply are left out. Workflows record
these words under idempotency keys through `RESERVATION_ANSWERS` and
`INTERVAL_ANSWERS`, so a replay is exactly the first answer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from coordinator.api.shapes import interval_outputs as iv_out
from coordinator.api.shapes import outputs as out
from coordinator.api.shapes.base import dump, keys
from coordinator.domain.errors import CoordinatorError
from coordinator.domain.intervals import Interval, IntervalReservation, format_time
from coordinator.domain.model import RollupRow
from coordinator.domain.reservation import Reservation
from coordinator.services.intervals import Shortfall


def error_body(code: str, message: str, details: Any = None) -> dict[str, Any]:
    body = out.ErrorBody(code=code, message=message, details=details or {})
    return dump(out.ErrorEnvelope(error=body))


def rollup_row(row: RollupRow) -> out.RollupRowOut:
    return out.RollupRowOut(
        resource=row.resource, total=row.total, allocatable=row.allocatable,
        allocated=row.allocated, reserved=row.reserved, available=row.available,
        provisioning=row.provisioning, unhealthy=row.unhealthy,
        maintenance=row.maintenance, unreachable=row.unreachable, updated_at=row.updated_at,
    )  # fmt: skip


def reservation(
    res: Reservation, now: int, warnings: Sequence[str] = (), idle_since: int | None = None
) -> out.ReservationOut:
    """A reservation with its state at `now` (and, answering its create, `warnings`; in
    reads, since when it is idle)."""
    risk = res.at_risk if res.live(now) else None
    return out.ReservationOut(
        reservation_id=res.reservation_id,
        tenant_id=res.tenant_id,
        pool_id=res.pool_id,
        state=res.state(now),
        start=res.start,
        end=res.end,
        spot=res.spot,
        binding=res.binding,
        atoms=[
            out.BookedAtomOut(atom_id=a.atom_id, node_id=a.node_id, cls=a.cls) for a in res.atoms
        ],
        created_at=res.created_at,
        project_id=res.project_id or None,
        lease_expires_at=res.lease_expires_at,
        preempt_at=res.preempt_at,
        resources=res.resources or None,
        gang=out.Gang.model_validate(res.gang) if res.gang else None,
        ended_at=res.ended_at,
        at_risk=out.AtRisk(reason=risk.reason, since=risk.since, atoms=list(risk.atoms))
        if risk is not None
        else None,
        warnings=list(warnings) or None,
        idle_since=idle_since if res.live(now) else None,
    )


def _interval(iv: Interval) -> iv_out.IntervalOut:
    return iv_out.IntervalOut(
        starts_at=format_time(iv.starts_at),
        ends_at=format_time(iv.ends_at),
        capacity_gb=iv.capacity_gb,
    )


def interval_reservation(res: IntervalReservation) -> iv_out.IntervalReservationOut:
    return iv_out.IntervalReservationOut(
        reservation_id=res.reservation_id,
        created_at=format_time(res.created_at),
        intervals=[_interval(iv) for iv in res.intervals],
    )


def intervals_refused(shortfalls: tuple[Shortfall, ...]) -> iv_out.CapacityNotAvailableBody:
    """Seed 002's 409: every interval that does not fit."""
    return iv_out.CapacityNotAvailableBody(
        error="capacity_not_available",
        intervals=[
            iv_out.IntervalShortfall(
                starts_at=format_time(s.starts_at),
                requested_gb=s.requested_gb,
                reservable_gb=s.reservable_gb,
                reason=s.reason,
            )
            for s in shortfalls
        ],
    )


_RES, _ATOM = keys(out.ReservationOut), keys(out.BookedAtomOut)


def created_body(res: Reservation, now: int, warnings: Sequence[str] = ()) -> dict[str, Any]:
    """`dump(reservation(res, now, warnings))`, built as that JSON object with the
    model's own keys: every create records it (a batch of 32, 32 of them), and the
    model's validation of values the ledger made cost a tenth of a create. The rare
    nested parts (gang, at risk) are still dumped from their models."""
    body: dict[str, Any] = {
        _RES.reservation_id: res.reservation_id,
        _RES.tenant_id: res.tenant_id,
        _RES.pool_id: res.pool_id,
        _RES.state: res.state(now),
        _RES.start: res.start,
        _RES.end: res.end,
        _RES.spot: res.spot,
        _RES.binding: res.binding,
        _RES.atoms: [
            {_ATOM.atom_id: a.atom_id, _ATOM.node_id: a.node_id, _ATOM.cls: a.cls}
            for a in res.atoms
        ],
        _RES.created_at: res.created_at,
    }
    live = res.live(now)
    risk = res.at_risk if live else None
    optional: tuple[tuple[str, Any], ...] = (
        (_RES.project_id, res.project_id or None),
        (_RES.lease_expires_at, res.lease_expires_at),
        (_RES.preempt_at, res.preempt_at),
        (_RES.resources, dict(res.resources) if res.resources else None),
        (_RES.gang, dump(out.Gang.model_validate(res.gang)) if res.gang else None),
        (_RES.ended_at, res.ended_at),
        (
            _RES.at_risk,
            dump(out.AtRisk(reason=risk.reason, since=risk.since, atoms=list(risk.atoms)))
            if risk is not None
            else None,
        ),
        (_RES.warnings, list(warnings) or None),
    )
    for key, value in optional:
        if value is not None:
            body[key] = value
    return body


class ReservationWords:
    """The words workflows record (`ReservationAnswers` and `IntervalAnswers`)."""

    def created(self, res: Reservation, now: int, warnings: Sequence[str] = ()) -> Any:
        return created_body(res, now, warnings)

    def refused(self, error: CoordinatorError) -> Any:
        return error_body(error.code, error.message, error.details)


class IntervalWords:
    def booked(self, res: IntervalReservation) -> Any:
        return dump(interval_reservation(res))

    def refused(self, shortfalls: tuple[Shortfall, ...]) -> Any:
        return dump(intervals_refused(shortfalls))


RESERVATION_ANSWERS = ReservationWords()
INTERVAL_ANSWERS = IntervalWords()


def shown_by(by: str, operator: bool) -> str:
    """Who acted, as a viewer may see it: operators see the key (`tenant/keyId`),
    tenants only that it was the operator — a key id is not theirs to know."""
    return by if operator or "/" not in by else "operator"
