"""Used against booked (SPEC §10), pure: the use buckets of a window beside the booked
time of the same window, per reservation and booked class, and the unbooked use per pool.

Buckets are hours: a window that cuts an hour counts that hour's use pro rata (of the
part of the hour before now, for the current one), so each
reservation's used time is capped at its booked time in the window (they can differ
only by the part of an hour a window cuts), and weighted at used. What a window holds
past `now` is not counted, as for booked time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from coordinator.domain.booked_hours import UsageSpan, ran_ms
from coordinator.domain.gpu_use_accrual import HOUR_MS, UNBOOKED


@dataclass(frozen=True, slots=True)
class UseHour:
    """One hour bucket of GPU use (as the ledger adds it up) of one reservation and
    resource: the time its units ran processes, and that time weighted by utilization."""

    hour: int
    reservation_id: str
    tenant_id: str
    pool_id: str
    project_id: str | None
    resource: str
    used_ms: int
    weighted_ms: int


@dataclass(frozen=True, slots=True)
class ReservationUse:
    reservation_id: str
    tenant_id: str
    pool_id: str
    project_id: str | None
    resource: str
    booked_ms: int  # unit-ms
    used_ms: int
    weighted_ms: int


@dataclass(frozen=True, slots=True)
class UnbookedUse:
    pool_id: str
    used_ms: int
    weighted_ms: int


def _share(hour: int, start: int, stop: int, now: int) -> float:
    """The part of a bucket inside [start, stop): of the hour, or of the part of it
    before `now` (all a bucket of the current hour can hold)."""
    top = min(hour + HOUR_MS, now)
    if top <= hour:
        return 1.0 if start <= hour < stop else 0.0
    return max(0, min(top, stop) - max(hour, start)) / (top - hour)


def reservation_use(
    spans: Iterable[UsageSpan],
    buckets: Iterable[UseHour],
    start: int,
    end: int,
    now: int,
) -> tuple[list[ReservationUse], list[UnbookedUse]]:
    """Per (reservation, booked class) that ran in [start, end): booked, used and
    weighted unit-ms; and per pool, the use no booking covered."""
    stop = min(end, now)
    booked: dict[tuple[str, str], int] = {}
    who: dict[tuple[str, str], tuple[str, str, str | None]] = {}
    for span in spans:
        ms = ran_ms(span, start, end, now) * span.amount
        if ms <= 0:
            continue
        key = (span.reservation_id, span.resource)
        booked[key] = booked.get(key, 0) + ms
        who[key] = (span.tenant_id, span.pool_id, span.project_id)
    used: dict[tuple[str, str], list[float]] = {}
    unbooked: dict[str, list[float]] = {}
    for b in buckets:
        share = _share(b.hour, start, stop, now)
        if share <= 0:
            continue
        if b.reservation_id == UNBOOKED:
            acc = unbooked.setdefault(b.pool_id, [0.0, 0.0])
        else:
            key = (b.reservation_id, b.resource)
            acc = used.setdefault(key, [0.0, 0.0])
            who.setdefault(key, (b.tenant_id, b.pool_id, b.project_id))
        acc[0] += b.used_ms * share
        acc[1] += b.weighted_ms * share
    rows = []
    for key in sorted(booked.keys() | used.keys()):
        tenant_id, pool_id, project_id = who[key]
        cap = booked.get(key, 0)
        u, w = used.get(key, (0.0, 0.0))
        used_ms = min(int(u), cap)
        rows.append(
            ReservationUse(
                key[0], tenant_id, pool_id, project_id, key[1], cap, used_ms, min(int(w), used_ms)
            )
        )
    free = [UnbookedUse(p, int(u), min(int(w), int(u))) for p, (u, w) in sorted(unbooked.items())]
    return rows, free


def use_totals(rows: Iterable[ReservationUse]) -> Mapping[tuple[str, str, str, str], list[int]]:
    """(tenant, pool, project or "", class) → [used, weighted] unit-ms."""
    out: dict[tuple[str, str, str, str], list[int]] = {}
    for r in rows:
        acc = out.setdefault((r.tenant_id, r.pool_id, r.project_id or "", r.resource), [0, 0])
        acc[0] += r.used_ms
        acc[1] += r.weighted_ms
    return out
