"""Use over time (SPEC §10), pure: how long each booked unit had a process (used time)
and that time weighted by its utilization, per reservation, and the same for use no
booking covered, in hour buckets the ledger adds up.

What counts: between two passes [a, b) a unit with at least one process is *used*; its
utilization (the device's SM utilization, else the sum of its processes', capped at
100 %) weights it. Where no figure exists (a MIG instance: NVML has none) the time is
counted as used with no figure (`unknown_ms`), never as 0 % busy.

Each booking covering the unit during [a, b) (the bookings of the whole window, not only
those live at its end: use up to a reservation's end is its own) is credited the part of
[a, b) it covers, times its share of the unit it booked: 1 for a GPU, a MIG instance or
a slot, 1/n of a whole-node booking's n units (a node-hour is used to the extent its
GPUs are). A unit several reservations share at once (time-slice or MPS slots) is
credited to the holders whose processes ran (by the process's `GPUFLEET_RESERVATION_ID`),
each for its own slots and weighted by its own processes' utilization where they have
one; a process none of its holders owns (no owner, a pod, a foreign reservation) is
split evenly among the holders with no process of their own. A holder with neither is
credited nothing. The part of [a, b) no booking covers goes to the unbooked bucket
(reservation "") of the tenant its processes' owners belong to at that pass
(`unbooked_tenant`): a bucket is keyed by tenant too, so two tenants taking one unbooked
GPU in turn within an hour each have their own time, never the first one's. So, for
every reservation, used ≤ booked, and weighted ≤ used.

Amounts are integer unit-milliseconds, rounded down.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from itertools import pairwise

from coordinator.domain.consumption import UNATTRIBUTED
from coordinator.domain.gpu_use_units import Hold, covers, shares, utilization
from shared.wire import IDLE_UTIL_PERCENT, DeviceUse

HOUR_MS = 3_600_000
UNBOOKED = ""


@dataclass(frozen=True, slots=True)
class AccrualKey:
    hour: int  # the bucket's start, ms
    reservation_id: str  # "" for use no booking covered
    node_id: str
    unit: str
    resource: str
    # The reservation's tenant; of unbooked use, its owners' (UNATTRIBUTED: nobody's).
    tenant_id: str


@dataclass(frozen=True, slots=True)
class AccrualWho:
    pool_id: str
    project_id: str | None


@dataclass(slots=True)
class Accrued:
    who: AccrualWho
    used_ms: int = 0
    weighted_ms: int = 0
    unknown_ms: int = 0  # of used_ms, the time with no utilization figure
    # Of used_ms, the time its utilization was under the idle threshold: chargeback
    # counts it as booked and not used (issue 35), as `reservation.idle` judges it.
    idle_ms: int = 0


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


def _stretches(
    holders: tuple[Hold, ...], start: int, end: int
) -> Iterable[tuple[int, int, tuple[Hold, ...]]]:
    """[start, end) cut wherever a holder starts or ends: (lo, hi, the holders covering
    all of it), for the stretches some holder covers."""
    cuts = sorted({start, end} | {t for h in holders for t in (h.start, h.end) if start < t < end})
    for lo, hi in pairwise(cuts):
        present = tuple(h for h in holders if h.start <= lo and hi <= h.end)
        if present:
            yield lo, hi, present


def _credit(
    add: Callable[[AccrualKey, AccrualWho, float, int | None], None],
    hour: int,
    node_id: str,
    unit: str,
    use: DeviceUse,
    util: int | None,
    present: tuple[Hold, ...],
    length: int,
) -> None:
    """Credit `length` ms of a used unit to the holders `present` all through it: all of
    it to a sole holder, by processes to several at once."""
    shared = len({h.reservation_id for h in present}) > 1
    credit = shares({h.reservation_id for h in present}, use) if shared else {}
    for h in present:
        part, h_util = credit.get(h.reservation_id, (0.0, None)) if shared else (1.0, util)
        key = AccrualKey(hour, h.reservation_id, node_id, unit, h.resource, h.tenant_id)
        add(
            key,
            AccrualWho(h.pool_id, h.project_id),
            length * part / len(h.units),
            h_util,
        )


def unbooked_tenant(use: DeviceUse, tenant_of: Mapping[str, str]) -> str:
    """The tenant a unit's unbooked time is charged to (on demand): the one tenant its
    processes' owners' reservations belong to, else nobody ("": unattributed, kept
    apart). A unit whose processes belong to several tenants at once is unattributed,
    never counted for two; tenants that follow one another each have their own time."""
    tenants = {
        tenant_of.get(p.owner, UNATTRIBUTED) if p.owner_kind == "reservation" else UNATTRIBUTED
        for p in use.processes
    }
    return tenants.pop() if len(tenants) == 1 else UNATTRIBUTED


def accrue(
    uses: Mapping[str, Mapping[str, DeviceUse]],
    holds: Iterable[Hold],
    pools: Mapping[str, str],
    windows: Mapping[str, tuple[int, int]],
    idle_util_percent: int = IDLE_UTIL_PERCENT,
    tenant_of: Mapping[str, str] | None = None,
) -> dict[AccrualKey, Accrued]:
    """The used and weighted unit-ms of [a, b) for each node in `windows` (node → its
    [a, b) since the last pass), from its units' `uses` and the `holds` covering them at
    any time in [a, b)."""
    covered = covers(holds)
    out: dict[AccrualKey, Accrued] = {}

    def add(key: AccrualKey, who: AccrualWho, used: float, util: int | None) -> None:
        used_ms = int(used)
        if used_ms <= 0:
            return
        acc = out.get(key)
        if acc is None:
            acc = out[key] = Accrued(who)
        acc.used_ms += used_ms
        if util is None:
            acc.unknown_ms += used_ms
        else:
            acc.weighted_ms += used_ms * util // 100
            if util < idle_util_percent:
                acc.idle_ms += used_ms

    for node_id, (a, b) in windows.items():
        pool_id = pools.get(node_id, "")
        for unit, use in uses.get(node_id, {}).items():
            if not use.processes or b <= a:
                continue
            util = utilization(use)
            tenant = unbooked_tenant(use, tenant_of or {})
            holders = covered.get((node_id, unit), ())
            for hour, start, end in _pieces(a, b):
                for lo, hi, present in _stretches(holders, start, end):
                    _credit(add, hour, node_id, unit, use, util, present, hi - lo)
                spans = ((h.start, h.end) for h in holders)
                free = (end - start) - _covered_length(spans, start, end)
                key = AccrualKey(hour, UNBOOKED, node_id, unit, "gpu", tenant)
                add(key, AccrualWho(pool_id, None), free, util)
    return out


def merge(into: dict[AccrualKey, Accrued], more: Mapping[AccrualKey, Accrued]) -> None:
    """Add `more` to `into` (passes kept in memory until they are written)."""
    for key, acc in more.items():
        held = into.get(key)
        if held is None:
            into[key] = Accrued(acc.who, acc.used_ms, acc.weighted_ms, acc.unknown_ms, acc.idle_ms)
        else:
            held.used_ms += acc.used_ms
            held.weighted_ms += acc.weighted_ms
            held.unknown_ms += acc.unknown_ms
            held.idle_ms += acc.idle_ms
