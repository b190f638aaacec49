"""Used against booked (SPEC §10), pure: the use buckets of a window beside the booked
time of the same window, per reservation and booked class, and the unbooked use per pool
and tenant (the tenant its processes' owners belong to, or none).

Buckets are hours. An hour inside the window counts whole. A reservation's bucket in an
hour the window cuts counts in the proportion of the reservation's own booked time in
that hour that lies inside the window: its use can only have accrued while it was
booked, so a window holding all of its booking in that hour counts all of its use there,
however short the booking or the window (a window cutting the booking itself counts its
use as spread evenly over the booked time). `spans` must therefore hold the bookings of
every hour the window touches, not only of the window. Unbooked use, which no booked
time bounds, counts in proportion to wall time (of the part of the hour before now, for
the current one). Splitting a window in two splits every share in two, so the parts add
up to the whole (to rounding). Each reservation's used time is capped at its booked
time in the window, and weighted at used. What a window holds past `now` is not
counted, as for booked time.

`weighted_ms` is None where some of the used time had no utilization figure (a MIG
instance: NVML has none for it): never 0 for "unknown".
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
    unknown_ms: int = 0  # of used_ms, the time with no utilization figure
    idle_ms: int = 0  # of used_ms, the time under the idle threshold


@dataclass(frozen=True, slots=True)
class ReservationUse:
    reservation_id: str
    tenant_id: str
    pool_id: str
    project_id: str | None
    resource: str
    booked_ms: int  # unit-ms
    used_ms: int
    weighted_ms: int | None  # None: some used time had no utilization figure
    idle_ms: int = 0  # of used_ms, the time under the idle threshold (chargeback: unused)


@dataclass(frozen=True, slots=True)
class UnbookedUse:
    pool_id: str
    used_ms: int
    weighted_ms: int | None
    tenant_id: str = ""  # the owners' tenant (`unbooked_tenant`); "": unattributed


def _wall_share(hour: int, start: int, stop: int, now: int) -> float:
    """The part of a bucket inside [start, stop) by wall time: of the hour, or of the
    part of it before `now` (all a bucket of the current hour can hold)."""
    top = min(hour + HOUR_MS, now)
    if top <= hour:
        return 1.0 if start <= hour < stop else 0.0
    return max(0, min(top, stop) - max(hour, start)) / (top - hour)


def _booked(spans: Iterable[UsageSpan], a: int, b: int, now: int) -> int:
    return sum(ran_ms(s, a, b, now) * s.amount for s in spans)


def reservation_use(
    spans: Iterable[UsageSpan],
    buckets: Iterable[UseHour],
    start: int,
    end: int,
    now: int,
) -> tuple[list[ReservationUse], list[UnbookedUse]]:
    """Per (reservation, booked class) that ran in [start, end): booked, used and
    weighted unit-ms; and per pool, the use no booking covered. `spans`: the bookings of
    every hour [start, end) touches."""
    stop = min(end, now)
    booked: dict[tuple[str, str], int] = {}
    who: dict[tuple[str, str], tuple[str, str, str | None]] = {}
    spans_of: dict[tuple[str, str], list[UsageSpan]] = {}
    for span in spans:
        key = (span.reservation_id, span.resource)
        spans_of.setdefault(key, []).append(span)
        ms = ran_ms(span, start, end, now) * span.amount
        if ms <= 0:
            continue
        booked[key] = booked.get(key, 0) + ms
        who[key] = (span.tenant_id, span.pool_id, span.project_id)
    # [used, weighted, unknown, idle]
    used: dict[tuple[str, str], list[float]] = {}
    unbooked: dict[tuple[str, str], list[float]] = {}  # (pool, tenant)
    for b in buckets:
        if start <= b.hour and b.hour + HOUR_MS <= stop:
            share = 1.0  # an hour inside the window (or the database's sum of them)
        elif b.reservation_id == UNBOOKED:
            share = _wall_share(b.hour, start, stop, now)
        else:
            own = spans_of.get((b.reservation_id, b.resource), ())
            top = min(b.hour + HOUR_MS, now)
            whole = _booked(own, b.hour, top, now)
            share = (
                _booked(own, max(b.hour, start), min(top, stop), now) / whole
                if whole > 0
                else _wall_share(b.hour, start, stop, now)
            )
        if share <= 0:
            continue
        if b.reservation_id == UNBOOKED:
            acc = unbooked.setdefault((b.pool_id, b.tenant_id), [0.0, 0.0, 0.0, 0.0])
        else:
            key = (b.reservation_id, b.resource)
            acc = used.setdefault(key, [0.0, 0.0, 0.0, 0.0])
            who.setdefault(key, (b.tenant_id, b.pool_id, b.project_id))
        acc[0] += b.used_ms * share
        acc[1] += b.weighted_ms * share
        acc[2] += b.unknown_ms * share
        acc[3] += b.idle_ms * share
    rows = []
    for key in sorted(booked.keys() | used.keys()):
        tenant_id, pool_id, project_id = who[key]
        cap = booked.get(key, 0)
        u, w, unknown, idle = used.get(key, (0.0, 0.0, 0.0, 0.0))
        used_ms = min(int(u), cap)
        rows.append(
            ReservationUse(
                key[0], tenant_id, pool_id, project_id, key[1], cap, used_ms,
                _weighted(w, unknown, used_ms), min(int(idle), used_ms),
            )
        )  # fmt: skip
    free = [
        UnbookedUse(p, int(u), _weighted(w, unknown, int(u)), t)
        for (p, t), (u, w, unknown, _) in sorted(unbooked.items())
    ]
    return rows, free


def _weighted(weighted: float, unknown: float, used_ms: int) -> int | None:
    if unknown > 0 and used_ms > 0:
        return None
    return min(int(weighted), used_ms)


def use_totals(
    rows: Iterable[ReservationUse],
) -> Mapping[tuple[str, str, str, str], tuple[int, int | None]]:
    """(tenant, pool, project or "", class) → (used, weighted) unit-ms; weighted None
    where any of its reservations' is."""
    out: dict[tuple[str, str, str, str], tuple[int, int | None]] = {}
    for r in rows:
        key = (r.tenant_id, r.pool_id, r.project_id or "", r.resource)
        u, w = out.get(key, (0, 0))
        out[key] = (
            u + r.used_ms,
            None if w is None or r.weighted_ms is None else w + r.weighted_ms,
        )
    return out
