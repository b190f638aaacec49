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
from datetime import UTC, datetime
from decimal import Decimal
from functools import lru_cache

from coordinator.domain.consumption import Consumption, gb_hours
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


@dataclass(frozen=True, slots=True)
class FocusRow:
    currency: str
    charge_start: int
    kind: str  # "Used" | "Unused" | "OnDemand"
    tenant_id: str | None
    pool_id: str
    quantity: Decimal  # GB-hours
    cost: Decimal

    def cells(self) -> list[str]:
        reserved = self.kind != "OnDemand"
        quantity, cost = format(self.quantity, "f"), format(self.cost, "f")
        return [
            "gpufleet", self.currency, *_periods(self.charge_start), "Usage", _WHAT[self.kind],
            quantity, UNIT, quantity, UNIT, "Committed" if reserved else "Standard",
            cost, cost, cost, cost, "gpufleet", "GPU memory", "Compute", self.tenant_id or "",
            self.pool_id, "GPU memory", "memory_gb",
            f"{self.pool_id}/{self.tenant_id}/memory" if reserved else "",
            self.kind if reserved else "", "", "", _tags(self.pool_id),
        ]  # fmt: skip


_WHAT = {
    "Used": "Reserved GPU memory, used",
    "Unused": "Reserved GPU memory, not used",
    "OnDemand": "GPU memory used above any reservation (on demand)",
}


def _iso(d: datetime) -> str:
    return d.strftime("%Y-%m-%dT%H:%M:%SZ")


# Every row of one interval shares its four times, every row of one pool its tags: an
# export formats each once (the bench: the export's rate against csv alone).
@lru_cache(maxsize=4096)
def _periods(start_ms: int) -> tuple[str, str, str, str]:
    """Billing period (the UTC calendar month) and charge period of an interval."""
    d = datetime.fromtimestamp(start_ms / 1000, tz=UTC)
    month = datetime(d.year, d.month, 1, tzinfo=UTC)
    month_end = datetime(d.year + d.month // 12, d.month % 12 + 1, 1, tzinfo=UTC)
    end = datetime.fromtimestamp((start_ms + INTERVAL_MS) / 1000, tz=UTC)
    return _iso(month), _iso(month_end), _iso(d), _iso(end)


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
        for kind, amount, price in (
            ("Used", c.covered, reserved_price),
            ("Unused", c.unused, reserved_price),
            ("OnDemand", c.on_demand, on_demand_price),
        ):
            if amount <= 0:
                continue
            quantity = gb_hours(amount)
            yield FocusRow(
                currency, c.quarter, kind, tenant, c.pool_id,
                quantity.quantize(QUANTUM), (quantity * price).quantize(QUANTUM),
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
