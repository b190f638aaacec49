"""Chargeback's reads (SPEC §13): memory reserved against memory used per tenant, pool
and quarter (`domain.consumption`), and device bookings' booked GPU-hours split into
used and unused (`domain.gpu_use_report`). Reads only: nothing is written."""

from __future__ import annotations

from coordinator.domain.booked_hours import HOUR_MS
from coordinator.domain.consumption import Consumption, consumption
from coordinator.domain.gpu_use_join import COVERING_CLASSES
from coordinator.domain.gpu_use_report import ReservationUse, UnbookedUse, reservation_use
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
