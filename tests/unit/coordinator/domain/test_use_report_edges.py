"""Used against booked at the edges (issue 31's mutation run): buckets an hour cut by
the window add up per reservation (weighted, unknown and idle alike), use with no
figure keeps weighted unknown however little (while under a millisecond is no use, and
leaves totals known), a bucket whose booking is not among the spans counts by wall
time, a window holding a whole booking counts all of its use, and a cut after a
booking's end does not lengthen it."""

from __future__ import annotations

from coordinator.domain.booked_hours import UsageSpan, ran_ms
from coordinator.domain.gpu_use_accrual import HOUR_MS
from coordinator.domain.gpu_use_report import UseHour, reservation_use, use_totals

H = HOUR_MS


def _bucket(
    hour: int, rid: str, used: int, weighted: int, unknown: int = 0, idle: int = 0
) -> UseHour:
    return UseHour(hour, rid, "acme", "p1", None, "gpu", used, weighted, unknown, idle)


def test_cut_buckets_add_up_per_reservation_in_every_column() -> None:
    """r1 is booked [0, 4H); the window [H/2, 3H) cuts hour 0 in half and holds hours
    1 and 2 whole: half of hour 0's bucket and all of the others count."""
    spans = [UsageSpan("acme", "p1", None, "gpu", 1, 0, 4 * H, "r1")]
    buckets = [_bucket(0, "r1", 1000, 800, 0, 200), _bucket(H, "r1", 1000, 600, 0, 100),
               _bucket(2 * H, "r1", 1000, 400, 0, 300)]  # fmt: skip
    (row,), _ = reservation_use(spans, buckets, H // 2, 3 * H, 10 * H)
    assert (row.used_ms, row.weighted_ms, row.idle_ms) == (2500, 1400, 500)


def test_use_with_no_figure_keeps_weighted_unknown_however_little() -> None:
    spans = [UsageSpan("acme", "p1", None, "gpu", 1, 0, H, "r1")]
    (row,), _ = reservation_use(spans, [_bucket(0, "r1", 1, 0, 1)], 0, H, 2 * H)
    assert (row.used_ms, row.weighted_ms) == (1, None)
    (cut,), _ = reservation_use(spans, [_bucket(0, "r1", 4, 0, 2)], 0, H // 2, 2 * H)
    assert cut.weighted_ms is None and cut.used_ms == 2


def test_a_bucket_whose_booking_is_not_among_the_spans_counts_by_wall_time() -> None:
    (row,), _ = reservation_use([], [_bucket(0, "r9", 1000, 500)], H // 4, H, 2 * H)
    assert (row.reservation_id, row.used_ms, row.booked_ms) == ("r9", 0, 0)


def test_a_cut_after_a_booking_s_end_does_not_lengthen_it() -> None:
    span = UsageSpan("acme", "p1", None, "gpu", 1, 0, H, "r1", cut=2 * H)
    assert ran_ms(span, 0, 3 * H, 4 * H) == H


def test_a_window_holding_a_whole_booking_counts_its_last_millisecond_too() -> None:
    """r1 is booked [H/2, H + 1 ms): its last millisecond falls in hour 1, which the
    window [0, 3H/2) cuts. All of r1's booking is inside the window, so all of its use
    counts, the same as over whole hours, not half of hour 1's by wall time."""
    spans = [UsageSpan("acme", "p1", None, "gpu", 1, H // 2, H + 1, "r1")]
    buckets = [_bucket(0, "r1", 1000, 600), _bucket(H, "r1", 1, 1)]
    (cut,), _ = reservation_use(spans, buckets, 0, H + H // 2, 3 * H)
    (whole,), _ = reservation_use(spans, buckets, 0, 2 * H, 3 * H)
    assert (cut.used_ms, cut.weighted_ms) == (whole.used_ms, whole.weighted_ms) == (1001, 601)


def test_under_a_millisecond_of_use_with_no_figure_leaves_the_totals_known() -> None:
    """r1 and r2 of one tenant are booked [0, H); r2's one millisecond of use had no
    utilization figure. The window [0, H/2) holds half of it, which is no whole
    millisecond: r2 used nothing there, weighted 0, and the tenant's weighted total is
    r1's, not unknown."""
    spans = [UsageSpan("acme", "p1", None, "gpu", 1, 0, H, rid) for rid in ("r1", "r2")]
    buckets = [_bucket(0, "r1", 2000, 1000), _bucket(0, "r2", 1, 0, 1)]
    rows, _ = reservation_use(spans, buckets, 0, H // 2, 2 * H)
    assert [(r.reservation_id, r.used_ms, r.weighted_ms) for r in rows] == [
        ("r1", 1000, 500),
        ("r2", 0, 0),
    ]
    assert use_totals(rows) == {("acme", "p1", "", "gpu"): (1000, 500)}
