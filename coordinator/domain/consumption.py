"""Chargeback (SPEC §13, issue 35), pure: reserved memory consumed by use, per tenant,
pool and 15-minute interval (the seed's grid), and the memory use it is computed from.

Memory use is accrued by the use pass: each process's GPU memory (`used_memory_mib`)
belongs to the tenant of the live reservation its owner names; a process whose owner
names none (a pod, a Slurm job, a unit, nobody) is unattributed (tenant `""`), kept as
its own row, never dropped nor given to a tenant. Between two passes [a, b) of a node
the memory seen at `b` is taken to have been held all through [a, b) (the use book's
rule for processes too), cut at quarter boundaries into MiB-milliseconds; the peak of a
quarter is the largest total a tenant held in the pool at one pass.

All arithmetic is in integer MiB-milliseconds, so `covered + unused = reserved` and
`covered + onDemand = used` hold exactly; GB (= GiB, the pool's `memoryGiB`, as the
interval API books it) and GB-hours are exact decimals of those.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal

from coordinator.domain.intervals import INTERVAL_MS
from shared.wire import DeviceUse

MIB_PER_GB = 1024
HOUR_MS = 3_600_000
UNATTRIBUTED = ""  # the tenant of use no live reservation owns


@dataclass(frozen=True, slots=True, order=True)
class MemoryKey:
    quarter: int  # the interval's start, ms
    tenant_id: str  # UNATTRIBUTED for use no reservation owns
    pool_id: str


@dataclass(slots=True)
class MemoryAccrued:
    mib_ms: int = 0
    peak_mib: int = 0


def _quarters(a: int, b: int) -> Iterable[tuple[int, int]]:
    """[a, b) cut at quarter boundaries: (quarter, length)."""
    while a < b:
        quarter = a - a % INTERVAL_MS
        end = min(b, quarter + INTERVAL_MS)
        yield quarter, end - a
        a = end


def owner_tenant(kind: str, owner: str, tenant_of: Mapping[str, str]) -> str:
    """The tenant a process's memory is charged to: its owner's live reservation's."""
    if kind == "reservation":
        return tenant_of.get(owner, UNATTRIBUTED)
    return UNATTRIBUTED


def accrue_memory(
    uses: Mapping[str, Mapping[str, DeviceUse]],
    tenant_of: Mapping[str, str],
    pools: Mapping[str, str],
    windows: Mapping[str, tuple[int, int]],
) -> dict[MemoryKey, MemoryAccrued]:
    """MiB-ms and peaks of each node's [a, b) in `windows` from its processes' memory
    (`uses` with owners as believed), charged per tenant and the node's pool."""
    held: dict[tuple[str, str], int] = {}  # (tenant, pool) → MiB at this pass
    spans: dict[tuple[str, str], list[tuple[int, int, int]]] = {}
    for node_id, (a, b) in windows.items():
        if b <= a:
            continue
        pool_id = pools.get(node_id, "")
        mine: dict[str, int] = {}
        for use in uses.get(node_id, {}).values():
            for p in use.processes:
                if not p.used_memory_mib:
                    continue
                tenant = owner_tenant(p.owner_kind, p.owner, tenant_of)
                mine[tenant] = mine.get(tenant, 0) + p.used_memory_mib
        for tenant, mib in mine.items():
            key = (tenant, pool_id)
            held[key] = held.get(key, 0) + mib
            spans.setdefault(key, []).append((a, b, mib))
    out: dict[MemoryKey, MemoryAccrued] = {}
    for (tenant, pool_id), pieces in spans.items():
        peak = held[(tenant, pool_id)]
        for a, b, mib in pieces:
            for quarter, length in _quarters(a, b):
                acc = out.setdefault(MemoryKey(quarter, tenant, pool_id), MemoryAccrued())
                acc.mib_ms += mib * length
                acc.peak_mib = max(acc.peak_mib, peak)
    return out


def merge_memory(
    into: dict[MemoryKey, MemoryAccrued], more: Mapping[MemoryKey, MemoryAccrued]
) -> None:
    """Add `more` to `into`: time adds up, peaks take the larger."""
    for key, acc in more.items():
        held = into.setdefault(key, MemoryAccrued())
        held.mib_ms += acc.mib_ms
        held.peak_mib = max(held.peak_mib, acc.peak_mib)


def gb(mib_ms: int) -> Decimal:
    """A quarter's MiB-ms as GB held on average over the quarter (time-weighted)."""
    return Decimal(mib_ms) / (MIB_PER_GB * INTERVAL_MS)


def gb_hours(mib_ms: int) -> Decimal:
    return Decimal(mib_ms) / (MIB_PER_GB * HOUR_MS)


@dataclass(frozen=True, slots=True)
class Consumption:
    """One tenant, pool and quarter: what was reserved and how use met it, in MiB-ms."""

    quarter: int
    tenant_id: str  # UNATTRIBUTED: use no reservation owns (nothing covers it)
    pool_id: str
    reserved: int
    used: int
    peak_mib: int

    @property
    def covered(self) -> int:
        return min(self.used, self.reserved)

    @property
    def unused(self) -> int:
        return self.reserved - self.covered

    @property
    def on_demand(self) -> int:
        return max(0, self.used - self.reserved)


def reserved_mib_ms(capacity_gb: int) -> int:
    """A quarter's reservation of `capacity_gb` as MiB-ms."""
    return capacity_gb * MIB_PER_GB * INTERVAL_MS


def consumption(
    reserved: Mapping[MemoryKey, int], used: Mapping[MemoryKey, MemoryAccrued]
) -> list[Consumption]:
    """One row per key with a reservation (GB) or use, sorted by quarter, tenant, pool.

    Unattributed use is its own row: no reservation covers it, so it is all on demand."""
    rows = []
    for key in sorted(reserved.keys() | used.keys()):
        gb_reserved = reserved.get(key, 0) if key.tenant_id != UNATTRIBUTED else 0
        acc = used.get(key, MemoryAccrued())
        rows.append(
            Consumption(
                key.quarter, key.tenant_id, key.pool_id, reserved_mib_ms(gb_reserved),
                acc.mib_ms, acc.peak_mib,
            )
        )  # fmt: skip
    return rows


@dataclass(frozen=True, slots=True)
class Totals:
    reserved: int = 0
    used: int = 0
    covered: int = 0
    unused: int = 0
    on_demand: int = 0


def totals(rows: Iterable[Consumption]) -> Totals:
    r = u = c = n = d = 0
    for row in rows:
        r, u, c = r + row.reserved, u + row.used, c + row.covered
        n, d = n + row.unused, d + row.on_demand
    return Totals(r, u, c, n, d)
