"""Bodies of chargeback's answers (SPEC §13): `GET /api/capacity/consumption` in seed
002's style (RFC 3339 times, GB) and the device bookings' `usage.consumption` (GPU-hours).

GB and GB-hours are decimals of the ledger's exact MiB-milliseconds, rounded to 6 places
for the wire (1 GB = 1 GiB = 1024 MiB, the pool's `memoryGiB` that intervals reserve)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from coordinator.api.shapes.base import ApiOutput
from coordinator.api.shapes.interval_outputs import Rfc3339

_TENANT = (
    "The tenant; null for use neither a reservation nor a tenant rule owns (unattributed, "
    "operators only)."
)


class ConsumptionRow(ApiOutput):
    starts_at: Rfc3339 = Field(description="The quarter-hour's start.")
    ends_at: Rfc3339 = Field(description="Its end.", examples=["2030-01-01T02:15:00Z"])
    tenant_id: str | None = Field(description=_TENANT)
    pool_id: str = Field(description="The pool.")
    reserved_gb: float = Field(description="GB the tenant's interval reservations hold then.")
    used_gb: float = Field(
        description="GB of host memory its owners' cgroups held, time-weighted over the quarter."
    )
    peak_gb: float = Field(description="The most it held at one use pass in the quarter.")
    covered_gb: float = Field(description="min(usedGb, reservedGb): use the reservation covered.")
    unused_gb: float = Field(description="reservedGb - coveredGb: reserved and not used.")
    on_demand_gb: float = Field(description="max(0, usedGb - reservedGb): use above it.")
    reserved_gb_hours: float = Field(description="reservedGb over the quarter, in GB-hours.")
    used_gb_hours: float = Field(description="usedGb over the quarter, in GB-hours.")
    covered_gb_hours: float = Field(description="coveredGb over the quarter, in GB-hours.")
    unused_gb_hours: float = Field(description="unusedGb over the quarter, in GB-hours.")
    on_demand_gb_hours: float = Field(description="onDemandGb over the quarter, in GB-hours.")


class ConsumptionTotals(ApiOutput):
    reserved_gb_hours: float = Field(description="Over every row of the window (all pages).")
    used_gb_hours: float = Field(description="Over every row of the window (all pages).")
    covered_gb_hours: float = Field(description="Over every row of the window (all pages).")
    unused_gb_hours: float = Field(description="Over every row of the window (all pages).")
    on_demand_gb_hours: float = Field(description="Over every row of the window (all pages).")


class Consumption(ApiOutput):
    from_: Rfc3339 = Field(alias="from", description="The window's start.")
    to: Rfc3339 = Field(description="The window's end.")
    resource: Literal["memory_gb"] = Field(description="What is counted.")
    intervals: list[ConsumptionRow] = Field(
        description="Each quarter, tenant and pool with a reservation or use, by startsAt, "
        "tenantId (unattributed first), poolId."
    )
    totals: ConsumptionTotals = Field(description="The window's sums, whatever the page.")
    next_cursor: str | None = Field(
        description="Pass as `cursor` for the next page; null on the last page.",
        examples=[None],
    )


class DeviceConsumptionRow(ApiOutput):
    reservation_id: str = Field(description="The device reservation.")
    tenant_id: str = Field(description="Its tenant.")
    pool_id: str = Field(description="Its pool.")
    project_id: str | None = Field(description="Its project.")
    resource: str = Field(description="The booked class (gpu, gpu.mig, gpu.slot, node).")
    booked_hours: float = Field(description="Unit-hours booked in the window (as it ran).")
    used_hours: float = Field(
        description="Of those, the hours its units ran a process at or above the idle "
        "threshold (`idle_util_percent`)."
    )
    idle_hours: float = Field(
        description="Hours a process ran under the idle threshold: counted as unused."
    )
    unused_hours: float = Field(description="bookedHours - usedHours (idle hours included).")


class OnDemandRow(ApiOutput):
    tenant_id: str | None = Field(
        description="The tenant its processes' owners belong to (their reservation, or the "
        "operator's mapping rules); null: unattributed (owners of no tenant, or of several)."
    )
    pool_id: str = Field(description="The pool.")
    used_hours: float = Field(description="GPU-hours of use no booking covered.")


class DeviceConsumption(ApiOutput):
    from_: int = Field(alias="from", description="Window start, ms.")
    to: int = Field(description="Window end, ms.")
    reservations: list[DeviceConsumptionRow] = Field(description="Per reservation and class.")
    on_demand: list[OnDemandRow] = Field(
        description="Unbooked GPU-hours per tenant and pool, on demand (a tenant's key: its "
        "own; every tenant's read: the unattributed use too)."
    )
