"""Chargeback's reads (SPEC §13): memory reserved against memory used per tenant, pool
and quarter (`domain.consumption`), device bookings' booked GPU-hours split into used
and unused and unbooked use per tenant (`domain.gpu_use_report`), and what the FOCUS
export adds to them: the interval reservations behind each commitment, each
reservation's GPU share and the nodes' region and zone. Reads only: nothing is
written."""

from __future__ import annotations

from collections.abc import Collection

from coordinator.domain.booked_hours import HOUR_MS, UsageSpan
from coordinator.domain.consumption import Consumption, MemoryKey, consumption
from coordinator.domain.focus import Commitments, Place, place
from coordinator.domain.focus_devices import DeviceHour, gpu_share, mean_share
from coordinator.domain.gpu_use_report import (
    ReservationUse,
    UnbookedUse,
    UseHour,
    reservation_use,
)
from coordinator.domain.gpu_use_units import COVERING_CLASSES
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
    arithmetic); and the use no booking covered, per tenant and pool (a tenant's read:
    its own; every tenant's: the unattributed use too)."""
    spans = await ledger.booked_spans.spans(
        start - start % HOUR_MS, -(-end // HOUR_MS) * HOUR_MS, tenant_id, pool_id, None
    )
    buckets = await ledger.gpu_use.summed(start, min(end, now), tenant_id, pool_id, None)
    gpu_spans = [s for s in spans if s.resource in COVERING_CLASSES]
    return reservation_use(gpu_spans, buckets, start, end, now)


async def memory_export(
    ledger: Ledger, start: int, end: int, tenant_id: str | None, pool_id: str | None
) -> tuple[list[Consumption], Commitments]:
    """`memory_consumption`'s rows and the interval reservations behind each row's
    reservation (read once: the rows' reserved memory is their sum, so the export's
    parts add up to the API's by construction)."""
    commitments = await ledger.focus_facts.commitments(start, end, tenant_id, pool_id)
    reserved = {MemoryKey(*k): sum(share.gb for share in v) for k, v in commitments.items()}
    used = await ledger.memory_use.used(start, end, tenant_id, pool_id)
    return consumption(reserved, used), commitments


async def pool_places(ledger: Ledger, pool_ids: Collection[str]) -> dict[str, Place]:
    """Each pool's region and zone: those all its nodes' labels share."""
    labels = await ledger.focus_facts.node_labels(pool_ids)
    return {p: place(nodes.values()) for p, nodes in labels.items()}


async def device_hours(
    ledger: Ledger, start: int, end: int, now: int, tenant_id: str | None, pool_id: str | None
) -> list[DeviceHour]:
    """Per hour of [start, end) (cut by the window at its ends), device reservation and
    class: booked, used and idle unit-ms (`reservation_use` of that hour), its GPU share
    and its nodes' region and zone; and each tenant's use in a pool no booking covered
    (a tenant's read: its own). For the FOCUS export."""
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
    pools = {s.pool_id for s in spans} | {b.pool_id for b in buckets}
    models = {}
    for p in sorted(pools):
        pool = await ledger.pools.get(p)
        models[p] = (pool.gpu_model if pool is not None else None) or ""
    labels = await ledger.focus_facts.node_labels(pools)
    atoms = await ledger.focus_facts.booked_atoms({s.reservation_id for s in spans})
    of_node = {n: node for nodes in labels.values() for n, node in nodes.items()}
    facts: dict[tuple[str, str], tuple[tuple[int, int], Place]] = {}
    for rid, booked in atoms.items():
        for cls in {a.cls for a in booked}:
            mine = [(a.node_id, a.attrs) for a in booked if a.cls == cls]
            facts[(rid, cls)] = (
                mean_share(gpu_share(cls, attrs) for _, attrs in mine),
                place(of_node.get(n, {}) for n in {n for n, _ in mine}),
            )
    places = {p: place(nodes.values()) for p, nodes in labels.items()}
    out: list[DeviceHour] = []
    for hour in sorted(by_hour.keys() | spans_of.keys()):
        lo, hi = max(hour, start), min(hour + HOUR_MS, end)
        if hi <= lo:
            continue
        rows, unbooked = reservation_use(spans_of.get(hour, []), by_hour.get(hour, []), lo, hi, now)
        for r in rows:
            share, where = facts.get((r.reservation_id, r.resource), ((1, 1), Place()))
            out.append(
                DeviceHour(lo, r.reservation_id, r.tenant_id, r.pool_id, models[r.pool_id],
                           r.resource, r.booked_ms, r.used_ms, r.idle_ms, hi - lo,
                           r.project_id, share, where)
            )  # fmt: skip
        out += [
            DeviceHour(lo, "", u.tenant_id or None, u.pool_id, models[u.pool_id], "gpu", 0,
                       u.used_ms, 0, hi - lo, None, (1, 1), places.get(u.pool_id, Place()))
            for u in unbooked
        ]  # fmt: skip
    return out
