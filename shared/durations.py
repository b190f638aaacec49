"""Reservation durations: integer seconds, `90m`/`2h`/`1d`/`45s`, or ISO 8601 (`PT2H`,
`P1DT30M`). Months and years are refused: their length depends on the calendar. One
rule for the API's `duration` and the CLI's (`gpufleet extend --by`)."""

from __future__ import annotations

import re

MAX_DURATION_S = 366 * 86400

_SHORT = re.compile(r"^(\d{1,9})([smhd])$")
_ISO = re.compile(
    r"^P(?:(?P<w>\d{1,6})W)?(?:(?P<d>\d{1,6})D)?"
    r"(?:T(?:(?P<h>\d{1,6})H)?(?:(?P<m>\d{1,9})M)?(?:(?P<s>\d{1,9})S)?)?$"
)
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}


class DurationError(ValueError):
    pass


def parse_duration(value: str | int) -> int:
    """Seconds, > 0 and at most 366 days; DurationError says why not."""
    if isinstance(value, bool):
        raise DurationError("duration must be seconds or a string like 90m, 2h, 1d, PT2H")
    if isinstance(value, int):
        seconds = value
    else:
        text = value.strip()
        short = _SHORT.match(text)
        iso = _ISO.match(text.upper()) if not short else None
        if short:
            seconds = int(short.group(1)) * _UNIT[short.group(2)]
        elif iso and text.upper() not in ("P", "PT") and not text.upper().endswith("T"):
            parts = {k: int(v) for k, v in iso.groupdict().items() if v}
            seconds = (
                parts.get("w", 0) * 7 * 86400
                + parts.get("d", 0) * 86400
                + parts.get("h", 0) * 3600
                + parts.get("m", 0) * 60
                + parts.get("s", 0)
            )
        else:
            raise DurationError(
                f"cannot read duration {value!r}: use seconds, 90m, 2h, 1d or ISO 8601 like PT2H"
            )
    if seconds <= 0:
        raise DurationError("duration must be positive")
    if seconds > MAX_DURATION_S:
        raise DurationError(f"duration is longer than {MAX_DURATION_S // 86400} days")
    return seconds
