"""Commitments over time: how much is promised at the busiest instant of a window.

One arithmetic for every limit the ledger checks or reports: a tenant's quota (compute
creates and interval reservations alike), the interval API's org limit per quarter-hour
and the rollup's scalar `reserved` column. A commitment is an amount held over
`[start, end)`; what counts against a limit is the PEAK of the sum of the commitments
live at one instant of the window, never the sum of every booking that overlaps it (two
bookings that never overlap do not add up). Pure: the ledger reads the commitments, this
module does the counting.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Commitment:
    start: int
    end: int
    amount: int


@dataclass(frozen=True, slots=True)
class Profile:
    """A step function: `levels[i]` is the total committed over
    `[points[i], points[i + 1])`; before the first point and after the last it is 0."""

    points: tuple[int, ...]
    levels: tuple[int, ...]

    @classmethod
    def of(cls, commitments: Iterable[Commitment]) -> Profile:
        changes: dict[int, int] = {}
        for c in commitments:
            if c.end <= c.start or not c.amount:
                continue
            changes[c.start] = changes.get(c.start, 0) + c.amount
            changes[c.end] = changes.get(c.end, 0) - c.amount
        points = tuple(sorted(changes))
        levels: list[int] = []
        level = 0
        for p in points:
            level += changes[p]
            levels.append(level)
        return cls(points, tuple(levels))

    def peak(self, start: int, end: int) -> int:
        """The most committed at any instant of `[start, end)` (0 for an empty window)."""
        if end <= start or not self.points:
            return 0
        # The step in force at `start`, then every step that begins inside the window.
        first = bisect_right(self.points, start) - 1
        last = bisect_left(self.points, end)
        best = self.levels[first] if first >= 0 else 0
        for i in range(max(first + 1, 0), last):
            best = max(best, self.levels[i])
        return best


def peak(commitments: Iterable[Commitment], start: int, end: int) -> int:
    """The most committed at one instant of `[start, end)`."""
    return Profile.of(commitments).peak(start, end)


def peaks(commitments: Iterable[Commitment], windows: Sequence[tuple[int, int]]) -> list[int]:
    """`peak` for each window, with one pass over the commitments."""
    profile = Profile.of(commitments)
    return [profile.peak(start, end) for start, end in windows]


def room(limit: int, used: int) -> int:
    """What a limit leaves for one more commitment, never below 0."""
    return max(0, limit - used)
