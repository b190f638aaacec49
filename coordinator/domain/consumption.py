"""Chargeback (SPEC §13, issue 35), pure: reserved memory consumed by use, per tenant,
pool and 15-minute interval (the seed's grid), and the memory use it is computed from.

Memory use is host memory, as the pool's `memoryGiB` is: what each owner of a node's
GPU processes holds in its cgroup (`OwnerMemory`, the agent's `agent.cgroup_memory`).
An owner is charged, in this order, to the tenant of the live reservation it names (its
`GPUFLEET_RESERVATION_ID`, or the bridge's Slurm reservation the job runs in, which the
agent reads as that reservation) when that reservation holds something on the owner's
node (whoever starts a process chooses its environment); else to the tenant of the
operator's first mapping rule it matches (`domain.tenant_rules`: Slurm account,
Kubernetes namespace, unix group); else to nobody: unattributed (tenant `""`), kept as
its own row, never dropped nor given to a tenant. Each owner's memory is one tenant's
or nobody's, never two. Between two passes [a, b) of a node the memory seen at `b` is
taken to have been held all through [a, b) (the use book's rule for processes too), cut
at quarter boundaries into MiB-milliseconds; the peak of a quarter is the largest total
a tenant held in the pool at one pass, each owner counted at the most it held since the
pass before (its cgroup's peak as reported).

All arithmetic is in integer MiB-milliseconds, so `covered + unused = reserved` and
`covered + onDemand = used` hold exactly; GB (= GiB, the pool's `memoryGiB`, as the
interval API books it) and GB-hours are exact decimals of those.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal

from coordinator.domain.intervals import INTERVAL_MS
from coordinator.domain.tenant_rules import NO_RULES, TenantRules
from shared.wire import OwnerMemory

MIB_PER_GB = 1024
HOUR_MS = 3_600_000
UNATTRIBUTED = ""  # the tenant of use no reservation nor rule owns


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


def owner_tenant(
    owner: OwnerMemory, tenant_of: Mapping[str, str], rules: TenantRules, booked: bool = True
) -> str:
    """The tenant an owner's memory is charged to: its live reservation's (`booked`: one
    that holds something on the owner's node), else the first mapping rule's it
    matches, else UNATTRIBUTED."""
    if owner.owner_kind == "reservation" and booked and owner.owner in tenant_of:
        return tenant_of[owner.owner]
    ruled = rules.tenant(owner.slurm_account, owner.k8s_namespace, owner.unix_group)
    return UNATTRIBUTED if ruled is None else ruled


def accrue_memory(
    memory: Mapping[str, Iterable[OwnerMemory]],
    tenant_of: Mapping[str, str],
    pools: Mapping[str, str],
    windows: Mapping[str, tuple[int, int]],
    rules: TenantRules = NO_RULES,
    booked: Collection[tuple[str, str]] | None = None,
) -> dict[MemoryKey, MemoryAccrued]:
    """MiB-ms and peaks of each node's [a, b) in `windows` from its owners' memory
    (`peak_mib`: the most each held since the pass before), charged per tenant and the
    node's pool. `booked`, (node, reservation) pairs: a reservation is believed only on
    the nodes it holds something on, so a process naming another tenant's reservation
    elsewhere does not charge that tenant (None: anywhere)."""
    held: dict[tuple[str, str], int] = {}  # (tenant, pool) → MiB at this pass, at peak
    spans: dict[tuple[str, str], list[tuple[int, int, int]]] = {}
    for node_id, (a, b) in windows.items():
        if b <= a:
            continue
        pool_id = pools.get(node_id, "")
        mine: dict[str, tuple[int, int]] = {}
        for owner in memory.get(node_id, ()):
            if not (owner.current_mib or owner.peak_mib):
                continue
            here = booked is None or (node_id, owner.owner) in booked
            tenant = owner_tenant(owner, tenant_of, rules, here)
            now_mib, peak_mib = mine.get(tenant, (0, 0))
            top = max(owner.current_mib, owner.peak_mib)
            mine[tenant] = (now_mib + owner.current_mib, peak_mib + top)
        for tenant, (mib, peak) in mine.items():
            key = (tenant, pool_id)
            held[key] = held.get(key, 0) + peak
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
