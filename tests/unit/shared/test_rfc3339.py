"""The one rule for RFC 3339 times (`shared.rfc3339`): the instant exactly, in any offset,
and a fraction accepted only when it is a whole number of milliseconds, whatever its
number of digits (SPEC §5: off the grid means rejected, never truncated)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.rfc3339 import NoOffset, NotRfc3339, OffMillisecondGrid, parse_ms

NOW = 1_893_456_000_000  # 2030-01-01T00:00:00Z
BASE = "2030-01-01T00:00:00"


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        (f"{BASE}Z", NOW),
        (f"{BASE}z", NOW),
        ("2030-01-01t00:00:00Z", NOW),
        ("2030-01-01T01:30:00+01:30", NOW),
        ("2029-12-31T23:00:00-01:00", NOW),
        (f"  {BASE}Z\n", NOW),
        (f"{BASE}.1Z", NOW + 100),
        (f"{BASE}.12Z", NOW + 120),
        (f"{BASE}.120Z", NOW + 120),
        (f"{BASE}.123Z", NOW + 123),
        (f"{BASE}.123000Z", NOW + 123),
        (f"{BASE}.123000000Z", NOW + 123),
        (f"{BASE}.999" + "0" * 5000 + "Z", NOW + 999),
        (f"{BASE}.000Z", NOW),
        ("1970-01-01T00:00:00Z", 0),
        ("1969-12-31T23:59:59.999Z", -1),
        ("6429-10-17T02:45:55.328Z", 2**47),
    ],
)
def test_times_on_the_millisecond_grid_are_their_exact_instant(text: str, ms: int) -> None:
    assert parse_ms(text) == ms
    assert type(parse_ms(text)) is int


@pytest.mark.parametrize(
    "fraction",
    ["1234", "0001", "0000001", "000000999", "000001", "1239", "123" + "0" * 5000 + "1"],
)
def test_a_fraction_off_the_millisecond_grid_is_refused_whatever_its_digits(
    fraction: str,
) -> None:
    for offset in ("Z", "+02:00", ""):
        with pytest.raises(OffMillisecondGrid):
            parse_ms(f"{BASE}.{fraction}{offset}")


@given(st.text(alphabet="0123456789", min_size=1, max_size=40))
def test_any_digit_string_is_accepted_exactly_when_it_is_whole_milliseconds(
    digits: str,
) -> None:
    # The fraction's value in units of 10^-len seconds is a whole number of ms exactly
    # when it is a multiple of 10^(len-3).
    value, scale = int(digits), 10 ** len(digits)
    whole = value * 1000 % scale == 0
    text = f"{BASE}.{digits}Z"
    if whole:
        assert parse_ms(text) == NOW + value * 1000 // scale
    else:
        with pytest.raises(OffMillisecondGrid):
            parse_ms(text)


@given(st.datetimes(min_value=datetime(1970, 1, 1), max_value=datetime(6000, 1, 1)))
def test_every_millisecond_written_out_reads_back(moment: datetime) -> None:
    # Exact: `timestamp()` is a float, which rounds .999999 s up to the next second in
    # far years (4148-01-01T00:00:00.999999 read back one second late).
    ms = (moment.replace(tzinfo=UTC) - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(
        milliseconds=1
    )
    text = moment.strftime("%Y-%m-%dT%H:%M:%S") + f".{moment.microsecond // 1000:03d}Z"
    assert parse_ms(text) == ms


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (BASE, NoOffset),
        (f"{BASE}.000", NoOffset),
        ("2030-01-01", NotRfc3339),
        ("2030-01-01 00:00:00Z", NotRfc3339),
        ("2030-01-01X00:00:00Z", NotRfc3339),
        ("2030-01-01T00:00Z", NotRfc3339),
        (f"{BASE}.Z", NotRfc3339),
        (f"{BASE},5Z", NotRfc3339),
        (f"{BASE}+0100", NotRfc3339),
        (f"{BASE}+01", NotRfc3339),
        (f"{BASE}+24:00", NotRfc3339),
        (f"{BASE}+01:60", NotRfc3339),
        ("2030-02-30T00:00:00Z", NotRfc3339),
        ("2030-01-01T24:00:00Z", NotRfc3339),
        ("2030-01-01T23:59:60Z", NotRfc3339),
        ("٢٠٣٠-01-01T00:00:00Z", NotRfc3339),
        (f"{BASE}.١Z", NotRfc3339),
        ("soon", NotRfc3339),
    ],
)
def test_what_is_not_an_rfc_3339_date_time_is_refused_saying_why(
    text: str, error: type[Exception]
) -> None:
    with pytest.raises(error):
        parse_ms(text)
