"""RFC 3339 times → epoch milliseconds, the one rule every parse path uses (the interval
API's bodies and query parameters, the calendar, the CLI's time flags).

The grammar is RFC 3339's `date-time`: `YYYY-MM-DDThh:mm:ss`, an optional fraction of
any number of digits, and an explicit offset (`Z` or `±hh:mm`); `T` and `Z` in either
case. Times are whole milliseconds (SPEC §5), so a fraction is accepted only when it
denotes a whole number of them: `.1`, `.120` and `.123000000` are, `.1234`, `.0000001`
and `.000000999` are not. Such a time is off the millisecond grid and refused with
`OffMillisecondGrid`, never truncated onto it, however many digits it has (`datetime`'s
own parser keeps six and drops the rest).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone

__all__ = ["NoOffset", "NotRfc3339", "OffMillisecondGrid", "TimeTextError", "parse_ms"]

# ASCII digits only: `\d` would take any script's digits.
_DATE_TIME = re.compile(
    r"(?P<date>[0-9]{4}-[0-9]{2}-[0-9]{2})[Tt]"
    r"(?P<time>[0-9]{2}:[0-9]{2}:[0-9]{2})(?:\.(?P<fraction>[0-9]+))?"
    r"(?P<offset>[Zz]|[+-][0-9]{2}:[0-9]{2})?"
)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class TimeTextError(ValueError):
    """A text that is not a time the API accepts; subclasses say why."""


class NotRfc3339(TimeTextError):
    """Not RFC 3339's `date-time` (or no such date or time of day)."""


class NoOffset(TimeTextError):
    """An RFC 3339 date and time without the offset that says which instant it is."""


class OffMillisecondGrid(TimeTextError):
    """A fraction that is not a whole number of milliseconds."""


def parse_ms(text: str) -> int:
    """The instant `text` names, as integer milliseconds since the epoch (UTC), exactly;
    surrounding whitespace is ignored. Raises a `TimeTextError` subclass saying why not."""
    match = _DATE_TIME.fullmatch(text.strip())
    if match is None:
        raise NotRfc3339(text)
    fraction = match["fraction"] or ""
    # Whole milliseconds: every digit past the third is zero. Read as text, so that no
    # number of digits is too many (int() refuses strings past 4300 digits).
    if fraction[3:].strip("0"):
        raise OffMillisecondGrid(text)
    offset = match["offset"]
    if offset is None:
        raise NoOffset(text)
    try:
        local = datetime.fromisoformat(f"{match['date']}T{match['time']}")
        zone = _zone(offset)
    except ValueError:
        raise NotRfc3339(text) from None
    whole_seconds = (local.replace(tzinfo=zone) - _EPOCH) // timedelta(seconds=1)
    return whole_seconds * 1000 + int(fraction[:3].ljust(3, "0"))


def _zone(offset: str) -> timezone:
    if offset in "Zz":
        return UTC
    hours, minutes = int(offset[1:3]), int(offset[4:6])
    if hours > 23 or minutes > 59:
        raise ValueError(offset)
    delta = timedelta(hours=hours, minutes=minutes)
    return timezone(-delta if offset[0] == "-" else delta)
