"""The FOCUS 1.2 export (SPEC §13, issue 35), pure: consumption rows become FinOps
FOCUS cost-and-usage rows, written as CSV in chunks.

One row per charge period (the seed's 15-minute interval), resource and reservation
status: of a tenant's reserved memory in a pool, the part used (`Used`) and the part
not (`Unused`), both at the reserved price; its use above the reservation on demand (no
capacity reservation, the on-demand price). Unattributed use is an on-demand row with
no SubAccountId. Quantities are GB-hours; costs `Decimal`, never float; with no rate
card (or no price effective then) costs are 0 and, with no card, the currency is
`XXX` (ISO 4217's "no currency"). The interval API books memory per pool and tenant,
not per reservation id, so `CapacityReservationId` names the tenant's commitment in
the pool: `<poolId>/<tenantId>/memory`.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from functools import lru_cache

from coordinator.domain.consumption import HOUR_MS, Consumption, gb_hours
from coordinator.domain.intervals import INTERVAL_MS
from coordinator.domain.rate_card import RateCard

NO_CURRENCY = "XXX"
QUANTUM = Decimal("0.0000000001")  # 10 places: sums stay exact far below a cent
COLUMNS = (
    "BillingAccountId", "BillingCurrency", "BillingPeriodStart", "BillingPeriodEnd",
    "ChargePeriodStart", "ChargePeriodEnd", "ChargeCategory", "ChargeDescription",
    "ConsumedQuantity", "ConsumedUnit", "PricingQuantity", "PricingUnit", "PricingCategory",
    "ListCost", "BilledCost", "EffectiveCost", "ContractedCost", "ProviderName",
    "ServiceName", "ServiceCategory", "SubAccountId", "ResourceId", "ResourceType", "SkuId",
    "CapacityReservationId", "CapacityReservationStatus", "RegionId", "AvailabilityZone",
    "Tags",
)  # fmt: skip
UNIT = "GB-Hours"
# Booked classes of device reservations: their FOCUS unit and what the rate card prices.
DEVICE_UNITS = {"gpu": "GPU-Hours", "gpu.mig": "MIG-Hours", "gpu.slot": "Slot-Hours",
                "node": "Node-Hours"}  # fmt: skip


@dataclass(frozen=True, slots=True)
class FocusRow:
    currency: str
    charge_start: int
    charge_ms: int  # the charge period's length: an interval (memory) or an hour (devices)
    status: str  # "Used" | "Unused" | "" (on demand: no capacity reservation)
    tenant_id: str | None
    resource_id: str  # the pool
    resource_type: str
    sku: str
    unit: str
    reservation_id: str  # "" on demand
    description: str
    quantity: Decimal
    cost: Decimal

    def cells(self) -> list[str]:
        reserved = self.status != ""
        quantity, cost = format(self.quantity, "f"), format(self.cost, "f")
        return [
            "gpufleet", self.currency, *_periods(self.charge_start, self.charge_ms), "Usage",
            self.description, quantity, self.unit, quantity, self.unit,
            "Committed" if reserved else "Standard", cost, cost, cost, cost, "gpufleet",
            self.resource_type, "Compute", self.tenant_id or "", self.resource_id,
            self.resource_type, self.sku, self.reservation_id, self.status, "", "",
            _tags(self.resource_id),
        ]  # fmt: skip


_WHAT = {
    "Used": "Reserved GPU memory, used",
    "Unused": "Reserved GPU memory, not used",
    "": "GPU memory used above any reservation (on demand)",
}


_EPOCH = datetime(1970, 1, 1)  # naive UTC: isoformat() is C-fast


def _iso(ms: int) -> str:
    return (_EPOCH + timedelta(milliseconds=ms)).isoformat(timespec="seconds") + "Z"


@lru_cache(maxsize=256)
def _month(year: int, month: int) -> tuple[str, str]:
    """The billing period: the UTC calendar month."""
    end = (year + month // 12, month % 12 + 1)
    return f"{year:04d}-{month:02d}-01T00:00:00Z", f"{end[0]:04d}-{end[1]:02d}-01T00:00:00Z"


# Every row of one period shares its four times, every row of one pool its tags: an
# export formats each once (the bench: the export's rate against csv alone).
@lru_cache(maxsize=4096)
def _periods(start_ms: int, length_ms: int) -> tuple[str, str, str, str]:
    """Billing period (the UTC calendar month) and charge period."""
    d = _EPOCH + timedelta(milliseconds=start_ms)
    return (*_month(d.year, d.month), _iso(start_ms), _iso(start_ms + length_ms))


@lru_cache(maxsize=4096)
def _tags(pool_id: str) -> str:
    return json.dumps({"gpufleet/pool": pool_id}, separators=(",", ":"))


def focus_rows(rows: Iterable[Consumption], card: RateCard | None) -> Iterator[FocusRow]:
    """The FOCUS rows of consumption rows: Used, Unused and on-demand parts that are
    not zero, priced by the card's memory_gb rate effective at the interval's start."""
    currency = card.currency if card is not None else NO_CURRENCY
    for c in rows:
        rate = card.rate("memory_gb", "*", c.quarter) if card is not None else None
        reserved_price = rate.reserved if rate is not None else Decimal(0)
        on_demand_price = rate.on_demand if rate is not None else Decimal(0)
        tenant = c.tenant_id or None
        for status, amount, price in (
            ("Used", c.covered, reserved_price),
            ("Unused", c.unused, reserved_price),
            ("", c.on_demand, on_demand_price),
        ):
            if amount <= 0:
                continue
            quantity = gb_hours(amount)
            yield FocusRow(
                currency, c.quarter, INTERVAL_MS, status, tenant, c.pool_id, "GPU memory",
                "memory_gb", UNIT, f"{c.pool_id}/{c.tenant_id}/memory" if status else "",
                _WHAT[status], quantity.quantize(QUANTUM), (quantity * price).quantize(QUANTUM),
            )  # fmt: skip


@dataclass(frozen=True, slots=True)
class DeviceHour:
    """One hour of one device reservation and booked class (or, `reservation_id` "",
    of a pool's use no booking covered): unit-ms booked, used and idle."""

    hour: int
    reservation_id: str
    tenant_id: str | None
    pool_id: str
    gpu_model: str
    resource: str
    booked_ms: int
    used_ms: int
    idle_ms: int
    length_ms: int = HOUR_MS  # less where the window cuts the hour


def device_rows(hours: Iterable[DeviceHour], card: RateCard | None) -> Iterator[FocusRow]:
    """Per hour and reservation: booked unit-hours used (a process above the idle
    threshold) and unused (idle included), at the reserved price; unbooked GPU use at
    the on-demand price. Only whole GPUs (`gpu`) are priced; other classes' costs are 0."""
    currency = card.currency if card is not None else NO_CURRENCY
    for h in hours:
        rate = card.rate("gpu", h.gpu_model, h.hour) if card and h.resource == "gpu" else None
        reserved_price = rate.reserved if rate is not None else Decimal(0)
        on_demand_price = rate.on_demand if rate is not None else Decimal(0)
        unit = DEVICE_UNITS.get(h.resource, "Hours")
        sku = f"{h.resource}:{h.gpu_model or 'any'}"
        if h.reservation_id == "":
            parts = [("", h.used_ms, on_demand_price)]
        else:
            busy = h.used_ms - h.idle_ms
            parts = [("Used", busy, reserved_price), ("Unused", h.booked_ms - busy, reserved_price)]
        for status, amount, price in parts:
            if amount <= 0:
                continue
            quantity = Decimal(amount) / HOUR_MS
            what = {
                "Used": "Booked GPU time, used", "Unused": "Booked GPU time, not used (or idle)",
                "": "GPU time used with no booking (on demand)",
            }[status]  # fmt: skip
            yield FocusRow(
                currency, h.hour, h.length_ms, status, h.tenant_id, h.pool_id, "GPU", sku, unit,
                h.reservation_id, what, quantity.quantize(QUANTUM),
                (quantity * price).quantize(QUANTUM),
            )  # fmt: skip


def csv_chunks(rows: Iterable[FocusRow], rows_per_chunk: int = 2000) -> Iterator[bytes]:
    """The header and rows as CSV (RFC 4180, `\\r\\n`), in chunks to stream."""
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(COLUMNS)
    n = 0
    for row in rows:
        writer.writerow(row.cells())
        n += 1
        if n % rows_per_chunk == 0:
            yield buf.getvalue().encode()
            buf.seek(0)
            buf.truncate()
    yield buf.getvalue().encode()
