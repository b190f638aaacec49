"""Use over time (SPEC §10), pure: how long each booked unit had a process (used time)
and that time weighted by its utilization, per reservation, and the same for use no
booking covered, in hour buckets the ledger adds up.

What counts: between two passes [a, b) a unit with at least one process is *used*; its
utilization (the device's SM utilization, else the sum of its processes', capped at
100 %; 0 when unknown) weights it. Each live booking covering the unit is credited the
part of [a, b) it covers, times its share of the unit it booked: 1 for a GPU, a MIG
instance or a slot, 1/n of a whole-node booking's n units (a node-hour is used to the
extent its GPUs are). The part of [a, b) no booking covers goes to the unbooked bucket
(reservation ""). So, for every reservation, used ≤ booked, and weighted ≤ used.

Amounts are integer unit-milliseconds, rounded down.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from coordinator.domain.gpu_use_join import Hold, covers, utilization
from shared.wire import DeviceUse

HOUR_MS = 3_600_000
UNBOOKED = ""


@dataclass(frozen=True, slots=True)
class AccrualKey:
    hour: int  # the bucket's start, ms
    reservation_id: str  # "" for use no booking covered
    node_id: str
    unit: str
    resource: str


@dataclass(frozen=True, slots=True)
class AccrualWho:
    tenant_id: str  # "" for unbooked use
    pool_id: str
    project_id: str | None


@dataclass(slots=True)
class Accrued:
    who: AccrualWho
    used_ms: int = 0
    weighted_ms: int = 0


def _pieces(a: int, b: int) -> Iterable[tuple[int, int, int]]:
    """[a, b) cut at hour boundaries: (hour, start, end)."""
    while a < b:
        hour = a - a % HOUR_MS
        end = min(b, hour + HOUR_MS)
        yield hour, a, end
        a = end


def _covered_length(spans: Iterable[tuple[int, int]], a: int, b: int) -> int:
    """The length of the union of `spans` inside [a, b)."""
    total, reach = 0, a
    for start, end in sorted((max(s, a), min(e, b)) for s, e in spans):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


def accrue(
    uses: Mapping[str, Mapping[str, DeviceUse]],
    holds: Iterable[Hold],
    pools: Mapping[str, str],
    windows: Mapping[str, tuple[int, int]],
) -> dict[AccrualKey, Accrued]:
    """The used and weighted unit-ms of [a, b) for each node in `windows` (node → its
    [a, b) since the last pass), from its units' `uses` and the `holds` covering them."""
    covered = covers(holds)
    out: dict[AccrualKey, Accrued] = {}

    def add(key: AccrualKey, who: AccrualWho, used: float, util: int) -> None:
        used_ms = int(used)
        if used_ms <= 0:
            return
        acc = out.get(key)
        if acc is None:
            acc = out[key] = Accrued(who)
        acc.used_ms += used_ms
        acc.weighted_ms += used_ms * util // 100

    for node_id, (a, b) in windows.items():
        pool_id = pools.get(node_id, "")
        for unit, use in uses.get(node_id, {}).items():
            if not use.processes or b <= a:
                continue
            util = utilization(use) or 0
            holders = covered.get((node_id, unit), ())
            for hour, start, end in _pieces(a, b):
                for h in holders:
                    overlap = min(end, h.end) - max(start, h.start)
                    if overlap <= 0:
                        continue
                    share = 1 / len(h.units)
                    key = AccrualKey(hour, h.reservation_id, node_id, unit, h.resource)
                    who = AccrualWho(h.tenant_id, h.pool_id, h.project_id)
                    add(key, who, overlap * share, util)
                spans = ((h.start, h.end) for h in holders)
                free = (end - start) - _covered_length(spans, start, end)
                key = AccrualKey(hour, UNBOOKED, node_id, unit, "gpu")
                add(key, AccrualWho("", pool_id, None), free, util)
    return out


def merge(into: dict[AccrualKey, Accrued], more: Mapping[AccrualKey, Accrued]) -> None:
    """Add `more` to `into` (passes kept in memory until they are written)."""
    for key, acc in more.items():
        held = into.get(key)
        if held is None:
            into[key] = Accrued(acc.who, acc.used_ms, acc.weighted_ms)
        else:
            held.used_ms += acc.used_ms
            held.weighted_ms += acc.weighted_ms
