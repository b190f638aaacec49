"""Timeline bucket arithmetic: defaults, limits, and booked whole GPUs per bucket."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

HOUR_MS = 3_600_000
MAX_SPAN_MS = 7 * 24 * HOUR_MS
MAX_BUCKETS = 336


@dataclass(frozen=True, slots=True)
class Window:
    start: int
    end: int
    step_ms: int


@dataclass(frozen=True, slots=True)
class BookedSpan:
    """One atom booked over [start, end)."""

    atom_id: str
    start: int
    end: int


class TimelineError(ValueError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def resolve_window(
    now: int, start: int | None, end: int | None, step_minutes: int | None
) -> Window:
    """from = start of the current hour, to = from + 24 h, step 60 min, unless given;
    at most 7 days and 336 buckets, and `to` after `from`."""
    frm = start if start is not None else now - now % HOUR_MS
    to = end if end is not None else frm + 24 * HOUR_MS
    step = (step_minutes if step_minutes is not None else 60) * 60_000
    if to <= frm:
        raise TimelineError("to", "to must be after from")
    if to - frm > MAX_SPAN_MS:
        raise TimelineError("to", "a timeline spans at most 7 days")
    buckets = -(-(to - frm) // step)
    if buckets > MAX_BUCKETS:
        raise TimelineError("stepMinutes", f"{buckets} buckets; at most {MAX_BUCKETS}")
    return Window(frm, to, step)


def booked_per_bucket(window: Window, bookings: Iterable[BookedSpan]) -> list[tuple[int, int, int]]:
    """(bucketStart, bucketEnd, distinct atoms booked at any time in the bucket)."""
    edges = list(range(window.start, window.end, window.step_ms))
    atoms: list[set[str]] = [set() for _ in edges]
    for b in bookings:
        for i, edge in enumerate(edges):
            bucket_end = min(edge + window.step_ms, window.end)
            if b.start < bucket_end and b.end > edge:
                atoms[i].add(b.atom_id)
    return [
        (edge, min(edge + window.step_ms, window.end), len(atoms[i]))
        for i, edge in enumerate(edges)
    ]
