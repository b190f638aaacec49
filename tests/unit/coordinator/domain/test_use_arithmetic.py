"""The arithmetic of usage reports on worked examples (SPEC §10; issue 31's mutation
run): booked unit-time per tenant, pool, project and class; totals of used and
weighted time; passes kept in memory and merged; the share of a bucket an hour the
window cuts counts — by the reservation's own booked time, or by wall time for use no
booking covered, up to now."""

from __future__ import annotations

from coordinator.domain.booked_hours import UsageRow, UsageSpan, usage_rows
from coordinator.domain.gpu_use_accrual import (
    HOUR_MS,
    UNBOOKED,
    AccrualKey,
    AccrualWho,
    Accrued,
    merge,
)
from coordinator.domain.gpu_use_report import (
    ReservationUse,
    UnbookedUse,
    UseHour,
    reservation_use,
    use_totals,
)

H = HOUR_MS
M = 60_000


def _span(
    rid: str, start: int, end: int, amount: int = 1, *, tenant: str = "t1",
    project: str | None = None, resource: str = "gpu",
) -> UsageSpan:  # fmt: skip
    return UsageSpan(tenant, "p", project, resource, amount, start, end, rid)


def test_booked_unit_time_adds_up_per_tenant_pool_project_and_class() -> None:
    """Spans that did not run in the window, or book nothing, add no row and stop
    nothing; a span that ran one millisecond counts; two reservations on one key make
    one row that counts both."""
    spans = [
        _span("r0", 5 * H, 6 * H, tenant="t0"),  # after the window
        _span("r4", 0, H, amount=0, tenant="t0"),  # books nothing
        _span("r1", 0, 2 * H, amount=2),
        _span("r2", H, 5 * H),
        _span("r3", 0, H, project="prj"),
        _span("r5", 3 * H - 1, 4 * H, tenant="t2", resource="nic"),
    ]
    rows = usage_rows(spans, 0, 3 * H, 10 * H)
    assert rows == [
        UsageRow("t1", "p", None, "gpu", 2 * 2 * H + 2 * H, 2),
        UsageRow("t1", "p", "prj", "gpu", H, 1),
        UsageRow("t2", "p", None, "nic", 1, 1),
    ]
    assert rows[0].hours == 6.0


def test_use_totals_add_used_and_weighted_and_keep_unknown_weight_unknown() -> None:
    def row(
        project: str | None, used: int, weighted: int | None, pool: str = "p"
    ) -> ReservationUse:
        return ReservationUse("r", "t", pool, project, "gpu", 10 * H, used, weighted)

    rows = [
        row(None, 10, 5),
        row(None, 20, 8),
        row("prj", 7, None),
        row("prj", 3, 2),
        row(None, 4, 3, pool="q"),
        row(None, 6, None, pool="q"),
    ]
    assert dict(use_totals(rows)) == {
        ("t", "p", "", "gpu"): (30, 13),
        ("t", "p", "prj", "gpu"): (10, None),
        ("t", "q", "", "gpu"): (10, None),
    }


def test_merged_passes_add_up_and_never_share_their_counters() -> None:
    who = AccrualWho("p", None)
    k1 = AccrualKey(0, "r1", "n1", "GPU-0", "gpu", "t")
    k2 = AccrualKey(0, UNBOOKED, "n1", "GPU-1", "gpu", "")
    first = {k1: Accrued(who, 10, 5, 1)}
    into: dict[AccrualKey, Accrued] = {}
    merge(into, first)
    first[k1].used_ms += 100  # the pass's own counter: what was merged stays
    merge(into, {k1: Accrued(who, 3, 2, 4), k2: Accrued(who, 7, 6, 0)})
    got = {k: (v.who, v.used_ms, v.weighted_ms, v.unknown_ms) for k, v in into.items()}
    assert got == {k1: (who, 13, 7, 5), k2: (who, 7, 6, 0)}


def test_a_cut_hour_counts_by_the_reservation_s_own_unit_time_in_it() -> None:
    """Two GPUs for the first half of hour H and one for the second: a window from the
    half hour holds a third of its booked unit-time in that hour, so a third of the
    hour's use."""
    spans = [_span("r", H, H + 30 * M, amount=2), _span("r", H + 30 * M, 2 * H)]
    bucket = UseHour(H, "r", "t1", "p", None, "gpu", 45 * M, 30 * M)
    rows, free = reservation_use(spans, [bucket], H + 30 * M, 3 * H, 5 * H)
    assert rows == [ReservationUse("r", "t1", "p", None, "gpu", 30 * M, 15 * M, 10 * M)]
    assert free == []


def test_unbooked_use_in_a_cut_hour_counts_by_wall_time_up_to_now() -> None:
    bucket = UseHour(H, UNBOOKED, "", "p", None, "gpu", 60 * M, 30 * M)
    # A past hour the window cuts at a quarter past: three quarters of it.
    assert reservation_use([], [bucket], H + 15 * M, 3 * H, 5 * H)[1] == [
        UnbookedUse("p", 45 * M, 22 * M + 30_000)
    ]
    # The current hour, half of it gone: its bucket holds that half; the window has
    # the second quarter of it.
    assert reservation_use([], [bucket], H + 15 * M, 3 * H, H + 30 * M)[1] == [
        UnbookedUse("p", 30 * M, 15 * M)
    ]
    # A bucket of the hour that begins now holds nothing yet for any window.
    assert reservation_use([], [bucket], 0, 2 * H, H) == ([], [])


def test_a_report_adds_each_reservation_s_spans_and_buckets_and_caps_at_booked() -> None:
    """Window [H+15 min, 3H), now 5H. `r`: two GPUs for an hour in it and one more
    span, busy two hours with some time unknown (its weighted time unknown); `g`: its
    use bucketed in an hour it booked nothing in (counted by wall time); `late`: use
    bucketed in the window, booked only after it (capped at nothing booked)."""
    spans = [
        _span("r", H + 15 * M, 2 * H + 15 * M, amount=2),
        _span("r", 2 * H + 15 * M, 3 * H),
        _span("g", 2 * H, 2 * H + 30 * M),
        _span("late", 4 * H, 5 * H, tenant="t2"),
    ]
    buckets = [
        UseHour(H, "r", "t1", "p", None, "gpu", 40 * M, 20 * M, 10 * M),
        UseHour(2 * H, "r", "t1", "p", None, "gpu", 30 * M, 15 * M),
        UseHour(H, "g", "t1", "p", None, "gpu", 20 * M, 8 * M),
        UseHour(2 * H, "late", "t2", "q", "prj", "gpu", 10 * M, 5 * M),
    ]
    rows, free = reservation_use(spans, buckets, H + 15 * M, 3 * H, 5 * H)
    assert rows == [
        ReservationUse("g", "t1", "p", None, "gpu", 30 * M, 15 * M, 6 * M),
        ReservationUse("late", "t2", "q", "prj", "gpu", 0, 0, 0),
        ReservationUse("r", "t1", "p", None, "gpu", 2 * H + 45 * M, 70 * M, None),
    ]
    assert free == []
