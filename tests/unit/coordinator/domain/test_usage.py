"""Usage counts the time bookings actually ran inside the window, up to now."""

from __future__ import annotations

from coordinator.domain.booked_hours import HOUR_MS, UsageSpan, usage_rows

T0 = 1_800_000_000_000


def span(
    start_h: float, end_h: float, *, amount: int = 1, cut_h: float | None = None,
    project: str | None = None, resource: str = "gpu", rid: str = "r1",
) -> UsageSpan:  # fmt: skip
    return UsageSpan(
        "acme", "pool_a", project, resource, amount, T0 + int(start_h * HOUR_MS),
        T0 + int(end_h * HOUR_MS), rid,
        None if cut_h is None else T0 + int(cut_h * HOUR_MS),
    )  # fmt: skip


def hours(spans: list[UsageSpan], start_h: float, end_h: float, now_h: float) -> dict[str, float]:
    rows = usage_rows(spans, T0 + int(start_h * HOUR_MS), T0 + int(end_h * HOUR_MS),
                      T0 + int(now_h * HOUR_MS))  # fmt: skip
    return {f"{r.project_id}:{r.resource}": r.hours for r in rows}


def test_released_early_counts_only_what_ran() -> None:
    # 4 GPUs booked for 10 h, released (end moved) after 2 h.
    assert hours([span(0, 2, amount=1, rid=f"r{k}") for k in range(4)], 0, 24, 24) == {
        "None:gpu": 8.0
    }


def test_preempted_counts_until_preemption_even_before_the_clock_persists_it() -> None:
    assert hours([span(0, 10, cut_h=3)], 0, 24, 24) == {"None:gpu": 3.0}


def test_window_and_now_clip_and_scalars_weigh_by_amount() -> None:
    spans = [span(-5, 5), span(0, 10, amount=64, resource="memoryGiB", project="prj_x")]
    # Window from -1 h; now at +2 h: the future is not usage yet.
    assert hours(spans, -1, 24, 2) == {"None:gpu": 3.0, "prj_x:memoryGiB": 128.0}
    assert hours([span(0, 1)], 5, 6, 24) == {}
