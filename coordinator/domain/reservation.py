"""Reservations as values: what is stored, and the state a reader sees at `now`.

Only terminal states are stored (released, expired, preempted); scheduled, active,
noticed and completed follow from the clock, so nothing has to run for a reservation to
become active or complete.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shared.reservation_states import LIVE_STATES, TERMINAL_STATES, ReservationState

# The stored state of a reservation that has not ended: which of the live states it is
# in follows from the clock.
LIVE = "booked"


@dataclass(frozen=True, slots=True)
class BookedAtom:
    atom_id: str
    node_id: str
    cls: str


@dataclass(frozen=True, slots=True)
class AtRisk:
    """Some of a reservation's atoms are out of service (SPEC §5): the weightiest
    reason among them, since when the reservation has been at risk, and which atoms."""

    reason: str
    since: int
    atoms: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Reservation:
    reservation_id: str
    tenant_id: str
    pool_id: str
    project_id: str | None
    stored_state: str
    spot: bool
    binding: str
    start: int
    end: int
    lease_seconds: int | None
    lease_expires_at: int | None
    preempt_at: int | None
    resources: dict[str, int]
    gang: dict[str, Any] | None
    atoms: tuple[BookedAtom, ...]
    created_at: int
    ended_at: int | None = None
    at_risk: AtRisk | None = None

    def state(self, now: int) -> ReservationState:
        if self.stored_state in TERMINAL_STATES:
            return self.stored_state
        # A notice or a lease only matters if it falls before the reservation's end.
        if self.preempt_at is not None and self.preempt_at < self.end:
            return "noticed" if now < self.preempt_at else "preempted"
        if self.lease_expires_at is not None and self.lease_expires_at < self.end:
            if now >= self.lease_expires_at:
                return "expired"
        if now < self.start:
            return "scheduled"
        if now < self.end:
            return "active"
        return "completed"

    def live(self, now: int) -> bool:
        return self.state(now) in LIVE_STATES
