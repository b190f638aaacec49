"""Usage accounting, pure: booked spans → unit-hours per tenant, pool, project and
resource over a window, counting only the time a booking actually ran.

A booking's span is what the ledger holds (release, expiry and preemption move its end);
the reservation's own `preemptAt` and lease expiry also cut it, so time between a
preemption and the clock persisting it is never billed. Nothing past `now` is counted:
a report over a window that reaches into the future shows usage so far.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

HOUR_MS = 3_600_000
MAX_WINDOW_MS = 366 * 24 * HOUR_MS


@dataclass(frozen=True, slots=True)
class UsageSpan:
    """One booking: `amount` units of `resource` (1 per atom) from `start` to `end`,
    cut at `cut` when its reservation was preempted or its lease ran out."""

    tenant_id: str
    pool_id: str
    project_id: str | None
    resource: str
    amount: int
    start: int
    end: int
    reservation_id: str
    cut: int | None = None


@dataclass(frozen=True, slots=True)
class UsageRow:
    tenant_id: str
    pool_id: str
    project_id: str | None
    resource: str
    unit_ms: int  # units × milliseconds
    reservations: int

    @property
    def hours(self) -> float:
        return self.unit_ms / HOUR_MS


def ran_ms(span: UsageSpan, start: int, end: int, now: int) -> int:
    """How long `span` ran inside [start, end), up to `now`."""
    stop = min(span.end, end, now, span.cut if span.cut is not None else span.end)
    return max(0, stop - max(span.start, start))


def usage_rows(spans: Iterable[UsageSpan], start: int, end: int, now: int) -> list[UsageRow]:
    """Unit-milliseconds per (tenant, pool, project, resource), sorted; spans that did
    not run inside the window add nothing (and no row)."""
    totals: dict[tuple[str, str, str, str], tuple[int, set[str]]] = {}
    for span in spans:
        ms = ran_ms(span, start, end, now)
        if ms <= 0 or span.amount <= 0:
            continue
        key = (span.tenant_id, span.pool_id, span.project_id or "", span.resource)
        unit_ms, ids = totals.get(key, (0, set()))
        ids.add(span.reservation_id)
        totals[key] = (unit_ms + ms * span.amount, ids)
    return [
        UsageRow(t, p, prj or None, r, unit_ms, len(ids))
        for (t, p, prj, r), (unit_ms, ids) in sorted(totals.items())
    ]
