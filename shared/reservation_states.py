"""The states a reservation is in, as the API reports and filters them and the CLI
offers them: the one list every reader and writer of a state imports.

Only the terminal ones are stored; the others follow from the clock (see
coordinator/domain/reservation.py)."""

from __future__ import annotations

from typing import Literal, get_args

ReservationState = Literal[
    "scheduled", "active", "noticed", "completed", "released", "expired", "preempted"
]
RESERVATION_STATES: tuple[ReservationState, ...] = get_args(ReservationState)
# What the CLI's `--state live` stands for, and what may still be at risk or renewed.
LIVE_STATES: tuple[ReservationState, ...] = ("scheduled", "active", "noticed")
TERMINAL_STATES: tuple[ReservationState, ...] = ("released", "expired", "preempted")
