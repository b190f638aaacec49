"""A counter's burst window (`agent.burst_window`): the baseline a reading is rated
against is the one DCGM's window gives (the newest sample at least a window old, else
the oldest kept), a reset starts over, and a fast poll keeps the window bounded."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from agent.burst_window import CounterWindow

WINDOW_S = 60.0


def reference(
    samples: list[tuple[int, float]], value: int, now: float
) -> tuple[list[tuple[int, float]], tuple[int, float]]:
    """The rule written plainly, over (value, at) pairs."""
    mine = [(v, at) for v, at in samples if v <= value]
    old = [x for x in mine if x[1] <= now - WINDOW_S]
    base = old[-1] if old else (mine[0] if mine else (value, now))
    recent = [x for x in mine if x[1] > now - WINDOW_S]
    return ([old[-1]] if old else []) + recent + [(value, now)], base


@given(
    st.lists(
        st.tuples(st.integers(0, 50), st.floats(0.1, 40.0), st.booleans()),
        min_size=1,
        max_size=60,
    )
)
def test_every_reading_is_rated_against_the_rule_s_baseline(
    steps: list[tuple[int, float, bool]],
) -> None:
    window, samples = CounterWindow.empty(), []
    now, value = 0.0, 0
    for rise, dt, reset in steps:
        now += dt
        value = rise if reset else value + rise
        window, base_value, base_at = window.advance(value, now, WINDOW_S)
        samples, expected = reference(samples, value, now)
        assert (base_value, base_at) == expected
        assert list(zip(window.values, window.times, strict=True)) == samples


def test_a_burst_within_the_window_is_measured_from_the_newest_old_sample() -> None:
    window = CounterWindow.empty()
    for at, value in ((0.0, 10), (30.0, 12), (61.0, 13), (90.0, 40)):
        window, base, since = window.advance(value, at, WINDOW_S)
    # At 90 s the newest sample at least 60 s old is the one of 30 s.
    assert (base, since) == (12, 30.0)


def test_a_reset_counter_starts_over() -> None:
    window = CounterWindow.empty()
    window, _, _ = window.advance(500, 0.0, WINDOW_S)
    window, base, since = window.advance(3, 1.0, WINDOW_S)
    assert (base, since) == (3, 1.0)  # nothing above 3 is kept: no burst of -497


def test_a_half_second_poll_keeps_one_window_of_samples() -> None:
    window = CounterWindow.empty()
    for k in range(2_400):  # 20 minutes at 0.5 s
        window, _, _ = window.advance(k, k * 0.5, WINDOW_S)
    # The samples of the last minute, plus the newest older one as the next baseline.
    assert len(window) == 121
    assert window.times[0] == (2_399 - 120) * 0.5
