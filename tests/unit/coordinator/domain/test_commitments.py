"""The peak arithmetic every quota, org limit and scalar `reserved` uses."""

from __future__ import annotations

import random

from coordinator.domain.commitments import Commitment, Profile, peak, peaks

Q = 900_000


def test_bookings_that_never_overlap_do_not_add_up() -> None:
    quarters = [Commitment(k * Q, (k + 1) * Q, 16) for k in range(96)]
    assert peak(quarters, 0, 96 * Q) == 16
    assert peak(quarters, -Q, 0) == 0
    assert peak(quarters, 96 * Q, 97 * Q) == 0


def test_overlapping_bookings_add_up_at_their_busiest_instant() -> None:
    held = [Commitment(0, 10, 4), Commitment(5, 20, 8), Commitment(15, 30, 16)]
    assert peak(held, 0, 5) == 4
    assert peak(held, 0, 6) == 12
    assert peak(held, 10, 15) == 8
    assert peak(held, 14, 16) == 24
    assert peak(held, 29, 40) == 16
    assert peak(held, 30, 40) == 0
    assert peak(held, 7, 7) == 0


def test_peaks_of_many_windows_equal_one_window_at_a_time() -> None:
    rng = random.Random(11)
    held = [
        Commitment(s, s + rng.randint(1, 50), rng.randint(1, 9))
        for s in (rng.randint(0, 200) for _ in range(60))
    ]
    windows = [(s, s + rng.randint(1, 40)) for s in (rng.randint(-20, 240) for _ in range(80))]

    def brute(start: int, end: int) -> int:
        return max(
            (sum(c.amount for c in held if c.start <= t < c.end) for t in range(start, end)),
            default=0,
        )

    assert peaks(held, windows) == [brute(s, e) for s, e in windows]


def test_empty_and_zero_length_commitments_hold_nothing() -> None:
    assert Profile.of([]).peak(0, 10) == 0
    assert peak([Commitment(5, 5, 100), Commitment(1, 3, 0)], 0, 10) == 0
