"""Interval reservations' rules (seed 002, SPEC §5) as pure functions: RFC 3339 times,
the validation table with its exact messages, calendar windows, list limits and the
reservable arithmetic."""

from __future__ import annotations

import time
from typing import Any

import pytest

from coordinator.domain.intervals import (
    INTERVAL_MS,
    LIST_DEFAULT_LIMIT,
    LIST_MAX_LIMIT,
    MAX_INTERVALS,
    MAX_TIME_MS,
    MAX_WINDOW_MS,
    Interval,
    IntervalError,
    format_time,
    parse_intervals,
    parse_limit,
    parse_time,
    parse_window,
    reservable_gb,
)

NOW = 1_893_456_000_000  # 2030-01-01T00:00:00Z
T0 = "2030-01-01T01:00:00Z"  # an hour ahead: past the 30-minute lead
T1 = "2030-01-01T01:15:00Z"
T2 = "2030-01-01T01:30:00Z"
HOUR = 3_600_000


def iv(start: str = T0, end: str = T1, gb: object = 8) -> dict[str, Any]:
    return {"startsAt": start, "endsAt": end, "capacityGb": gb}


def refusal(body: object, now: int = NOW) -> str:
    with pytest.raises(IntervalError) as caught:
        parse_intervals(body, now)
    return str(caught.value)


def test_times_parse_exactly_in_any_offset_and_off_the_millisecond_grid_are_refused() -> None:
    assert parse_time("2030-01-01T00:00:00Z", "t") == NOW
    assert parse_time("2030-01-01t00:00:00z", "t") == NOW
    assert parse_time("2030-01-01T01:00:00+01:00", "t") == NOW
    assert parse_time(" 2030-01-01T00:00:00.250000000Z ", "t") == NOW + 250
    assert parse_time("1970-01-01T00:00:00Z", "t") == 0
    assert parse_time("2030-01-01T00:00:00.250Z", "t") == NOW + 250
    for fraction in ("0001", "0000001", "000000999", "0009999999999999999999"):
        with pytest.raises(IntervalError, match=r"^t: .* has a fraction below the millisecond$"):
            parse_time(f"2030-01-01T00:00:00.{fraction}Z", "t")
    with pytest.raises(IntervalError, match=r"^t: 'soon' is not an RFC 3339 time$"):
        parse_time("soon", "t")
    # Whole milliseconds, as integers (they are written back into JSON).
    assert type(parse_time("2030-01-01T00:00:00Z", "t")) is int


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (17, "f: must be an RFC 3339 time string"),
        ("2030-01-01", "f: '2030-01-01' is not an RFC 3339 time"),
        ("2030-01-01 00:00:00Z", "f: '2030-01-01 00:00:00Z' is not an RFC 3339 time"),
        # `fromisoformat` takes any one character between date and time; RFC 3339 only T.
        ("2030-01-01X00:00:00Z", "f: '2030-01-01X00:00:00Z' is not an RFC 3339 time"),
        ("2030-01-01Tnoon:00:00Z", "f: '2030-01-01Tnoon:00:00Z' is not an RFC 3339 time"),
        (
            "2030-01-01T00:00:00.000",
            "f: '2030-01-01T00:00:00.000' is not an RFC 3339 time: no UTC offset",
        ),
        ("2030-01-01T00:00:00X", "f: '2030-01-01T00:00:00X' is not an RFC 3339 time"),
        ("1969-12-31T23:59:59Z", "f: '1969-12-31T23:59:59Z' is out of range (1970 to 6429)"),
        ("9999-12-31T23:59:59Z", "f: '9999-12-31T23:59:59Z' is out of range (1970 to 6429)"),
    ],
)
def test_times_that_are_not_rfc_3339_in_range_are_refused(value: object, message: str) -> None:
    with pytest.raises(IntervalError) as caught:
        parse_time(value, "f")
    assert str(caught.value) == message


def test_the_last_time_the_api_accepts_is_2_to_the_47_ms() -> None:
    last = format_time(MAX_TIME_MS)
    assert parse_time(last, "t") == MAX_TIME_MS
    with pytest.raises(IntervalError, match="out of range"):
        parse_time(last.replace(".328Z", ".329Z"), "t")


def test_times_are_written_back_in_utc_with_milliseconds_only_when_there_are_some(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Whatever the machine's own zone.
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        assert format_time(NOW) == "2030-01-01T00:00:00Z"
    finally:
        monkeypatch.undo()
        time.tzset()
    assert format_time(NOW) == "2030-01-01T00:00:00Z"
    assert format_time(NOW + 5) == "2030-01-01T00:00:00.005Z"
    assert format_time(NOW + 250) == "2030-01-01T00:00:00.250Z"
    assert format_time(NOW + INTERVAL_MS + 1000) == "2030-01-01T00:15:01Z"


def test_a_valid_request_is_its_intervals_sorted_by_start() -> None:
    body = {"intervals": [iv(T1, T2, 4), iv(T0, T1, 12)], "poolId": "ignored here"}
    assert parse_intervals(body, NOW) == [
        Interval(NOW + HOUR, NOW + HOUR + INTERVAL_MS, 12),
        Interval(NOW + HOUR + INTERVAL_MS, NOW + HOUR + 2 * INTERVAL_MS, 4),
    ]
    # Exactly the lead time ahead is enough.
    assert parse_intervals({"intervals": [iv()]}, NOW + HOUR - 30 * 60_000)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([], "body must be a JSON object with an `intervals` list"),
        ({"intervals": [iv()], "extra": 1, "also": 2}, "unknown fields: also, extra"),
        ({}, "intervals: must be a non-empty list"),
        ({"intervals": []}, "intervals: must be a non-empty list"),
        ({"intervals": iv()}, "intervals: must be a non-empty list"),
        ({"intervals": ["x"]}, "intervals[0]: must be an object"),
        (
            {"intervals": [iv() | {"b": 1, "a": 2}]},
            "intervals[0]: unknown fields: a, b",
        ),
        (
            {"intervals": [iv(start="soon")]},
            "intervals[0].startsAt: 'soon' is not an RFC 3339 time",
        ),
        ({"intervals": [iv(end=None)]}, "intervals[0].endsAt: must be an RFC 3339 time string"),
        (
            {"intervals": [iv("2030-01-01T01:00:01Z", "2030-01-01T01:15:01Z")]},
            "intervals[0].startsAt: not aligned to a 15-minute UTC boundary\n"
            "intervals[0].endsAt: not aligned to a 15-minute UTC boundary",
        ),
        (
            {"intervals": [iv("2030-01-01T01:00:00.0001Z", "2030-01-01T01:15:00.0001Z")]},
            "intervals[0].startsAt: not aligned to a 15-minute UTC boundary\n"
            "intervals[0].endsAt: not aligned to a 15-minute UTC boundary",
        ),
        (
            {"intervals": [iv("2030-01-01T01:00:00.009Z", "2030-01-01T01:15:00.009Z")]},
            "intervals[0].startsAt: not aligned to a 15-minute UTC boundary\n"
            "intervals[0].endsAt: not aligned to a 15-minute UTC boundary",
        ),
        (
            {"intervals": ["x", iv(gb=6)]},
            "intervals[0]: must be an object\n"
            "intervals[1].capacityGb: must be a positive multiple of 4",
        ),
        (
            {"intervals": [iv(start="soon"), iv(gb=6)]},
            "intervals[0].startsAt: 'soon' is not an RFC 3339 time\n"
            "intervals[1].capacityGb: must be a positive multiple of 4",
        ),
        (
            {"intervals": [iv(T0, T2)]},
            "intervals[0].endsAt: must be startsAt + 15 minutes (enumerate longer spans)",
        ),
        (
            {"intervals": [iv(T1, T0)]},
            "intervals[0].endsAt: must be startsAt + 15 minutes (enumerate longer spans)",
        ),
        ({"intervals": [iv(gb=0)]}, "intervals[0].capacityGb: must be a positive multiple of 4"),
        ({"intervals": [iv(gb=-4)]}, "intervals[0].capacityGb: must be a positive multiple of 4"),
        ({"intervals": [iv(gb=6)]}, "intervals[0].capacityGb: must be a positive multiple of 4"),
        ({"intervals": [iv(gb=8.0)]}, "intervals[0].capacityGb: must be a positive multiple of 4"),
        ({"intervals": [iv(gb=True)]}, "intervals[0].capacityGb: must be a positive multiple of 4"),
        ({"intervals": [iv(gb="8")]}, "intervals[0].capacityGb: must be a positive multiple of 4"),
        (
            {"intervals": [iv("2030-01-01T00:15:00Z", "2030-01-01T00:30:00Z")]},
            "intervals[0].startsAt: must be at least 30 minutes from now",
        ),
        (
            {"intervals": [iv(), iv(gb=4)]},
            "intervals[1].startsAt: duplicate interval in this request",
        ),
        (
            {"intervals": [iv(gb=5), iv(T1, T2, 3)]},
            "intervals[0].capacityGb: must be a positive multiple of 4\n"
            "intervals[1].capacityGb: must be a positive multiple of 4",
        ),
    ],
)
def test_each_rule_of_the_table_is_refused_with_its_message(body: object, message: str) -> None:
    assert refusal(body) == message


def test_at_most_a_week_of_quarters_per_request() -> None:
    many = {"intervals": [iv()] * (MAX_INTERVALS + 1)}
    assert refusal(many) == f"intervals: at most 672 per request, got {MAX_INTERVALS + 1}"
    week = [
        iv(
            format_time(NOW + HOUR + k * INTERVAL_MS),
            format_time(NOW + HOUR + (k + 1) * INTERVAL_MS),
        )
        for k in range(MAX_INTERVALS)
    ]
    assert len(parse_intervals({"intervals": week}, NOW)) == MAX_INTERVALS


def test_calendar_windows_are_on_the_grid_and_list_windows_whole_milliseconds() -> None:
    window = parse_window(T0, T2, grid=True)
    assert window == (NOW + HOUR, NOW + HOUR + 2 * INTERVAL_MS)
    assert [type(t) for t in window] == [int, int]
    assert parse_window(T0, "2030-01-01T01:00:00.001Z", grid=False) == (NOW + HOUR, NOW + HOUR + 1)
    longest = format_time(NOW + MAX_WINDOW_MS)
    assert parse_window(format_time(NOW), longest, grid=True) == (NOW, NOW + MAX_WINDOW_MS)
    for frm, to, grid, message in [
        (None, T0, True, "from and to are required"),
        (T0, None, False, "from and to are required"),
        ("2030-01-01T01:00:01Z", T2, True, "from/to: must be on the 15-minute UTC grid"),
        (T0, "2030-01-01T01:30:00.0001Z", True, "from/to: must be on the 15-minute UTC grid"),
        (
            T0,
            "2030-01-01T01:30:00.0001Z",
            False,
            "to: '2030-01-01T01:30:00.0001Z' has a fraction below the millisecond",
        ),
        ("soon", T0, True, "from: 'soon' is not an RFC 3339 time"),
        (T0, "soon", True, "to: 'soon' is not an RFC 3339 time"),
        ("soon", T0, False, "from: 'soon' is not an RFC 3339 time"),
        (T0, "soon", False, "to: 'soon' is not an RFC 3339 time"),
        (T0, T0, True, "to: must be after from"),
        (T1, T0, False, "to: must be after from"),
        (
            format_time(NOW),
            format_time(NOW + MAX_WINDOW_MS + INTERVAL_MS),
            True,
            "to: the window is at most 35 days",
        ),
    ]:
        with pytest.raises(IntervalError) as caught:
            parse_window(frm, to, grid=grid)
        assert str(caught.value) == message


def test_list_limits_default_clamp_and_refuse() -> None:
    assert parse_limit(None) == LIST_DEFAULT_LIMIT == 50
    assert parse_limit("1") == 1
    assert parse_limit("200") == LIST_MAX_LIMIT == 200
    assert parse_limit("201") == LIST_MAX_LIMIT
    for raw, message in [("ten", "limit: must be an integer"), ("0", "limit: must be at least 1")]:
        with pytest.raises(IntervalError) as caught:
            parse_limit(raw)
        assert str(caught.value) == message


@pytest.mark.parametrize(
    ("room", "free", "reservable"),
    [(100, 50, 48), (50, 100, 48), (8, 8, 8), (7, 100, 4), (3, 100, 0), (-8, 100, 0), (100, -4, 0)],
)
def test_reservable_is_the_tighter_bound_on_the_4_gb_grain(
    room: int, free: int, reservable: int
) -> None:
    assert reservable_gb(room, free) == reservable


@pytest.mark.parametrize(
    "fraction", ["0001", "000001", "0000001", "000000999", "1" + "0" * 40 + "1"]
)
def test_a_time_off_the_millisecond_grid_is_misaligned_whatever_its_digits(fraction: str) -> None:
    """SPEC §5: such a time is rejected as misaligned, not truncated onto 01:00 (seven
    digits and more used to be dropped by `datetime.fromisoformat`)."""
    off = f"2030-01-01T01:00:00.{fraction}Z"
    assert refusal({"intervals": [iv(off, T1)]}) == (
        "intervals[0].startsAt: not aligned to a 15-minute UTC boundary"
    )
    assert refusal({"intervals": [iv(T0, off.replace("01:00:00", "01:15:00"))]}) == (
        "intervals[0].endsAt: not aligned to a 15-minute UTC boundary"
    )
    with pytest.raises(IntervalError, match=r"^from/to: must be on the 15-minute UTC grid$"):
        parse_window(off, T2, grid=True)
    with pytest.raises(IntervalError, match=r"^from: .* has a fraction below the millisecond$"):
        parse_window(off, T2, grid=False)


def test_trailing_zeros_keep_a_time_on_the_grid() -> None:
    on = "2030-01-01T01:00:00." + "0" * 12 + "Z"
    assert parse_intervals({"intervals": [iv(on, "2030-01-01T01:15:00.000000000Z")]}, NOW) == [
        Interval(NOW + HOUR, NOW + HOUR + INTERVAL_MS, 8)
    ]
    assert parse_window(on, T2, grid=True) == (NOW + HOUR, NOW + HOUR + 2 * INTERVAL_MS)


def test_a_time_off_the_millisecond_grid_does_not_hide_the_problems_of_later_intervals() -> None:
    """All problems, one per line: an interval whose time has no exact value is judged
    no further, and the intervals after it still are (a duplicate, a lead too short)."""
    off = "2030-01-01T01:00:00.0000001Z"
    assert refusal(
        {"intervals": [iv(off, T1), iv(T0, T1), iv(T0, T1), iv("2030-01-01T00:15:00Z")]}
    ) == "\n".join(
        [
            "intervals[0].startsAt: not aligned to a 15-minute UTC boundary",
            "intervals[2].startsAt: duplicate interval in this request",
            "intervals[3].endsAt: must be startsAt + 15 minutes (enumerate longer spans)",
            "intervals[3].startsAt: must be at least 30 minutes from now",
        ]
    )
