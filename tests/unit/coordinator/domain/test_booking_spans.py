"""The nodes with a booking outside a window (`booking_spans`): whether the bookings sit
in the sorted lists or in the tail added since, the answer is the one a scan of every
booking gives, and a copy grows apart from its original."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.domain.booking_spans import TAIL, BookingSpans, Span

spans = st.tuples(st.integers(0, 40), st.integers(1, 10), st.sampled_from("abcdefgh")).map(
    lambda t: (t[0], t[0] + t[1], t[2])
)
# Chunks of every size up to past the tail's: a booking's few atoms, and a reload.
chunks = st.lists(st.lists(spans, max_size=TAIL + 40), max_size=4)


def scanned(all_spans: list[Span], start: int, end: int) -> set[str]:
    return {n for s, e, n in all_spans if e <= start or s >= end}


@settings(max_examples=60, deadline=None)
@given(chunks, st.integers(0, 50), st.integers(1, 10))
def test_a_window_sees_every_booking_outside_it_sorted_or_not(
    added: list[list[Span]], start: int, length: int
) -> None:
    kept = BookingSpans()
    every: list[Span] = []
    for chunk in added:
        kept.add(chunk)
        every += chunk
        assert kept.outside(start, start + length) == scanned(every, start, start + length)
    assert len(kept) == len(every)


def test_a_copy_and_its_original_grow_apart() -> None:
    kept = BookingSpans()
    kept.add([(0, 10, "a")] * (TAIL + 1))  # sorted in
    kept.add([(20, 30, "b")])  # in the tail
    twin = kept.copy()
    twin.add([(40, 50, "c")] * (TAIL + 1))
    kept.add([(0, 5, "d")])
    assert kept.outside(10, 20) == {"a", "b", "d"}
    assert twin.outside(10, 20) == {"a", "b", "c"}
    assert (len(kept), len(twin)) == (TAIL + 3, 2 * TAIL + 3)
