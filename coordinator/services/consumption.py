"""Chargeback's reads (SPEC §13): memory reserved against memory used per tenant, pool
and quarter (`domain.consumption`), and device bookings' booked GPU-hours split into
used and unused (`domain.gpu_use_report`). Reads only: nothing is written."""

from __future__ import annotations

from coordinator.domain.booked_hours import HOUR_MS, UsageSpan
from coordinator.domain.consumption import Consumption, consumption
from coordinator.domain.focus import DeviceHour
from coordinator.domain.gpu_use_join import COVERING_CLASSES
from coordinator.domain.gpu_use_report import (
    ReservationUse,
    UnbookedUse,
    UseHour,
    reservation_use,
)
from coordinator.ledger import Ledger


async def memory_consumption(
    ledger: Ledger, start: int, end: int, tenant_id: str | None, pool_id: str | None
) -> list[Consumption]:
    """Every quarter of [start, end) with a reservation or use, of this tenant (None:
    every tenant and the unattributed use) and pool (None: every pool)."""
    reserved = await ledger.memory_use.reserved(start, end, tenant_id, pool_id)
    used = await ledger.memory_use.used(start, end, tenant_id, pool_id)
    return consumption(reserved, used)


async def device_consumption(
    ledger: Ledger, start: int, end: int, now: int, tenant_id: str | None, pool_id: str | None
) -> tuple[list[ReservationUse], list[UnbookedUse]]:
    """Per device reservation: booked and used unit-ms in [start, end) (`usage.report`'s
    arithmetic); and the use no booking covered, per pool (every tenant's reads only)."""
    spans = await ledger.booked_spans.spans(
        start - start % HOUR_MS, -(-end // HOUR_MS) * HOUR_MS, tenant_id, pool_id, None
    )
    buckets = await ledger.gpu_use.summed(start, min(end, now), tenant_id, pool_id, None)
    gpu_spans = [s for s in spans if s.resource in COVERING_CLASSES]
    rows, unbooked = reservation_use(gpu_spans, buckets, start, end, now)
    return rows, unbooked if tenant_id is None else []


async def device_hours(
    ledger: Ledger, start: int, end: int, now: int, tenant_id: str | None, pool_id: str | None
) -> list[DeviceHour]:
    """Per hour of [start, end) (cut by the window at its ends), device reservation and
    class: booked, used and idle unit-ms (`reservation_use` of that hour); and for every
    tenant's reads, each pool's use no booking covered. For the FOCUS export."""
    lo_hour = start - start % HOUR_MS
    spans = [
        s
        for s in await ledger.booked_spans.spans(
            lo_hour, -(-end // HOUR_MS) * HOUR_MS, tenant_id, pool_id, None
        )
        if s.resource in COVERING_CLASSES
    ]
    buckets = await ledger.gpu_use.buckets(start, min(end, now), tenant_id, pool_id, None)
    by_hour: dict[int, list[UseHour]] = {}
    for b in buckets:
        by_hour.setdefault(b.hour, []).append(b)
    spans_of: dict[int, list[UsageSpan]] = {}
    for s in spans:
        first = max(lo_hour, s.start - s.start % HOUR_MS)
        for hour in range(first, min(s.end, end), HOUR_MS):
            spans_of.setdefault(hour, []).append(s)
    models: dict[str, str] = {}
    out: list[DeviceHour] = []
    for hour in sorted(by_hour.keys() | spans_of.keys()):
        lo, hi = max(hour, start), min(hour + HOUR_MS, end)
        if hi <= lo:
            continue
        rows, unbooked = reservation_use(spans_of.get(hour, []), by_hour.get(hour, []), lo, hi, now)
        for p in {r.pool_id for r in rows} | {u.pool_id for u in unbooked}:
            if p not in models:
                pool = await ledger.pools.get(p)
                models[p] = (pool.gpu_model if pool is not None else None) or ""
        out += [
            DeviceHour(lo, r.reservation_id, r.tenant_id, r.pool_id, models[r.pool_id],
                       r.resource, r.booked_ms, r.used_ms, r.idle_ms, hi - lo)
            for r in rows
        ]  # fmt: skip
        if tenant_id is None:
            out += [
                DeviceHour(
                    lo, "", None, u.pool_id, models[u.pool_id], "gpu", 0, u.used_ms, 0, hi - lo
                )
                for u in unbooked
            ]
    return out
