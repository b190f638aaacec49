"""Interval reservations (seed 002): 15-minute UTC-aligned intervals of pool memory.

Pure rules, `now` passed in: parsing RFC 3339 times (any offset, compared in UTC), the
validation table, the calendar grid and the reservable arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from coordinator.domain.reservation import AtRisk
from shared.rfc3339 import NoOffset, OffMillisecondGrid, TimeTextError, parse_ms

INTERVAL_MS = 15 * 60 * 1000
LEAD_MS = 30 * 60 * 1000
GRAIN_GB = 4
MAX_INTERVALS = 672  # one week of quarter-hours per request
MAX_WINDOW_MS = 35 * 24 * 3600 * 1000  # calendar and audit list windows
LIST_DEFAULT_LIMIT = 50
LIST_MAX_LIMIT = 200
# Times the API accepts: from the epoch to 2^47 ms (the year 6429), as the compute API's
# epoch-millisecond fields; anything else could not be stored or written back out.
MAX_TIME_MS = 140737488355328


class IntervalError(ValueError):
    """A request broke one of the seed's rules; the message says which and where."""


@dataclass(frozen=True, slots=True)
class Interval:
    starts_at: int
    ends_at: int
    capacity_gb: int


@dataclass(frozen=True, slots=True)
class IntervalReservation:
    reservation_id: str
    tenant_id: str
    pool_id: str
    created_at: int
    intervals: tuple[Interval, ...]
    # While the pool has promised more memory than it has in service in a quarter this
    # holds (`pool_memory`); the seed's bodies do not show it, alerts and the ledger do.
    at_risk: AtRisk | None = None


@dataclass(frozen=True, slots=True)
class QuarterUsage:
    """One quarter-hour as a tenant sees it: the limit shown (its pool quota, else its
    tenant-wide quota, else the pool's memory), what counts against that limit at the
    quarter's busiest instant, the pool's free memory after every booking, and the room
    the tightest of the limits that apply still leaves."""

    limit_gb: int
    tenant_gb: int
    pool_free_gb: int
    room_gb: int

    @property
    def reservable(self) -> int:
        return reservable_gb(self.room_gb, self.pool_free_gb)


def _parse(value: object, field: str) -> int | None:
    """An RFC 3339 time with an explicit offset (`Z` or `±hh:mm`) → milliseconds since the
    epoch (UTC), exactly; None for one off the millisecond grid, whatever the number of
    digits (`shared.rfc3339` declares the rule): such a time is off every grid the API
    has, misaligned, never truncated onto it (SPEC §5)."""
    if not isinstance(value, str):
        raise IntervalError(f"{field}: must be an RFC 3339 time string")
    try:
        ms = parse_ms(value)
    except OffMillisecondGrid:
        return None
    except NoOffset:
        raise IntervalError(f"{field}: {value!r} is not an RFC 3339 time: no UTC offset") from None
    except TimeTextError:
        raise IntervalError(f"{field}: {value!r} is not an RFC 3339 time") from None
    if not 0 <= ms <= MAX_TIME_MS:
        raise IntervalError(f"{field}: {value!r} is out of range (1970 to 6429)")
    return ms


def parse_time(value: object, field: str) -> int:
    """An RFC 3339 time → ms since the epoch; one with a fraction that is not a whole
    number of milliseconds is refused, since the API's times are whole milliseconds."""
    ms = _parse(value, field)
    if ms is None:
        raise IntervalError(f"{field}: {value!r} has a fraction below the millisecond")
    return ms


def _on_grid(ms: int | None) -> bool:
    return ms is not None and ms % INTERVAL_MS == 0


def format_time(ms: int) -> str:
    dt = datetime.fromtimestamp(ms / 1000, tz=UTC)
    if ms % 1000:
        return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"
    return dt.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_intervals(body: object, now: int) -> list[Interval]:
    """Every rule of the seed's validation table; all problems, one per line."""
    if not isinstance(body, dict):
        raise IntervalError("body must be a JSON object with an `intervals` list")
    unknown = sorted(set(body) - {"intervals", "poolId"})
    if unknown:
        raise IntervalError(f"unknown fields: {', '.join(unknown)}")
    items = body.get("intervals")
    if not isinstance(items, list) or not items:
        raise IntervalError("intervals: must be a non-empty list")
    if len(items) > MAX_INTERVALS:
        raise IntervalError(f"intervals: at most {MAX_INTERVALS} per request, got {len(items)}")
    problems: list[str] = []
    out: list[Interval] = []
    seen: set[int] = set()
    for i, item in enumerate(items):
        where = f"intervals[{i}]"
        if not isinstance(item, dict):
            problems.append(f"{where}: must be an object")
            continue
        extra = sorted(set(item) - {"startsAt", "endsAt", "capacityGb"})
        if extra:
            problems.append(f"{where}: unknown fields: {', '.join(extra)}")
        try:
            start = _parse(item.get("startsAt"), f"{where}.startsAt")
            end = _parse(item.get("endsAt"), f"{where}.endsAt")
        except IntervalError as exc:
            problems.append(str(exc))
            continue
        gb = item.get("capacityGb")
        if not _on_grid(start):
            problems.append(f"{where}.startsAt: not aligned to a 15-minute UTC boundary")
        if not _on_grid(end):
            problems.append(f"{where}.endsAt: not aligned to a 15-minute UTC boundary")
        # Off the millisecond grid (None), a time is misaligned and nothing more is said
        # of it: its span and lead time have no exact value to judge.
        if start is not None and end is not None and end != start + INTERVAL_MS:
            problems.append(
                f"{where}.endsAt: must be startsAt + 15 minutes (enumerate longer spans)"
            )
        if isinstance(gb, bool) or not isinstance(gb, int) or gb <= 0 or gb % GRAIN_GB:
            problems.append(f"{where}.capacityGb: must be a positive multiple of {GRAIN_GB}")
        if start is None or end is None:
            continue
        if start < now + LEAD_MS:
            problems.append(f"{where}.startsAt: must be at least 30 minutes from now")
        if start in seen:
            problems.append(f"{where}.startsAt: duplicate interval in this request")
        seen.add(start)
        if isinstance(gb, int) and not isinstance(gb, bool):
            out.append(Interval(start, end, gb))
    if problems:
        raise IntervalError("\n".join(problems))
    return sorted(out, key=lambda iv: iv.starts_at)


def parse_window(frm: str | None, to: str | None, *, grid: bool) -> tuple[int, int]:
    """`from`/`to` query parameters: both required, `to` after `from`, at most 35 days;
    on the 15-minute grid for the calendar."""
    if frm is None or to is None:
        raise IntervalError("from and to are required")
    if grid:
        grid_start, grid_end = _parse(frm, "from"), _parse(to, "to")
        if (
            grid_start is None
            or grid_end is None
            or grid_start % INTERVAL_MS
            or grid_end % INTERVAL_MS
        ):
            raise IntervalError("from/to: must be on the 15-minute UTC grid")
        start, end = grid_start, grid_end
    else:
        start, end = parse_time(frm, "from"), parse_time(to, "to")
    if end <= start:
        raise IntervalError("to: must be after from")
    if end - start > MAX_WINDOW_MS:
        raise IntervalError("to: the window is at most 35 days")
    return start, end


def parse_limit(
    raw: str | None, default: int = LIST_DEFAULT_LIMIT, most: int = LIST_MAX_LIMIT
) -> int:
    """A page's `limit` query value: the seed's rule (an integer of at least 1; above
    the list's maximum, the maximum), with each list's own default and maximum."""
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise IntervalError("limit: must be an integer") from None
    if value < 1:
        raise IntervalError("limit: must be at least 1")
    return min(value, most)


def reservable_gb(room_gb: int, pool_free_gb: int) -> int:
    """What one more request may take in an interval: within the room every limit leaves
    and the pool's free memory, rounded down to the 4 GB grain."""
    room = max(0, min(room_gb, pool_free_gb))
    return room - room % GRAIN_GB
