"""Which reservations are idle now, as the alert feed heard it: the open
`reservation.idle` conditions (SPEC §10) the console counts on its fleet and pool cards
and marks on its timeline (issue 34).

Every replica hears every alert on the bus, so every replica keeps this book, whichever
one the console talks to. A `reservation.idle` opens a reservation's condition, its
`reservation.inUse` (use again, idleness not judged, or the reservation ended) closes
it. A replica started after an idle was said does not know it until it is said again.
The book is bounded: past `keep` open conditions the oldest said is dropped (the
console then undercounts; it never shows an idleness that ended)."""

from __future__ import annotations

from shared.wire import Alert

OPENS = "reservation.idle"
CLOSES = "reservation.inUse"


class IdleBook:
    def __init__(self, keep: int = 10_000) -> None:
        self._keep = keep
        self._open: dict[str, Alert] = {}  # by reservation id, oldest said first

    def note(self, alert: Alert) -> None:
        rid = alert.reservation_id
        if rid is None:
            return
        if alert.kind == OPENS:
            self._open.pop(rid, None)
            self._open[rid] = alert
            while len(self._open) > self._keep:
                del self._open[next(iter(self._open))]
        elif alert.kind == CLOSES:
            self._open.pop(rid, None)

    def open(self) -> list[Alert]:
        """The open conditions, oldest said first."""
        return list(self._open.values())
