"""GPU use in the simulation (SPEC §10; issue 31): every host's agent reports what runs
on its GPUs and the leader's use pass (`GpuUseWatch.tick`, the real service, its
buckets written at every pass) credits the time since the last pass to the bookings of
that time; the reference model keeps the same use intervals and credits them on its
own: each to the reservations whose booked time covers it.

What must hold after every pass, per reservation of the sequence:

- it is credited at most the time its own bookings cover of the use intervals on their
  units (a whole-node booking: at most the interval, whatever number of its GPUs ran);
- where it was a unit's only holder, it is credited all of the time its booking
  covers — use up to its end is its own, and none of it goes to the next holder.

A pass's use stands for all of [the last pass, this pass) (the agent's state at the
pass, as the service reads it); the sequence's passes are steps like any other, so
bookings begin, end, are released and rebooked between two passes.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from coordinator.domain.gpu_use_units import COVERING_CLASSES, GPU_CLASSES, unit_of
from coordinator.services.gpu_use_watch import GpuUseWatch
from shared.subjects import Subjects
from shared.wire import DeviceUse, Inventory, ProcessUse, UseReport
from tests.fakes import RecordingAlerts
from tests.simulation.base import MINUTE, MachineBase
from tests.simulation.ledger_view import BookingRow, LedgerView

# Every window between two passes counts (the service's default drops gaps over 60 s:
# here a pass is a step, and steps move the clock by up to three hours).
GAP_MS = 6 * 60 * MINUTE
# A use interval: (node, unit, from, to).
UseSpan = tuple[str, str, int, int]


class _NoBus:
    async def publish(self, subject: str, payload: bytes) -> None:
        return None


class UseRules(MachineBase):
    def __init__(self) -> None:
        super().__init__()
        self.use = GpuUseWatch(
            self.ledger, Subjects(), self.clock, _NoBus(), RecordingAlerts(),
            lambda node_id: True, max_gap_ms=GAP_MS, flush_ms=0,
        )  # fmt: skip
        self.use_log: list[UseSpan] = []
        self.use_last: dict[str, int] = {}
        self.use_versions = itertools.count(1)

    def recorded(self, inv: Inventory) -> None:
        """The use service keeps only the use of units a recorded inventory has (issue
        32): the node watch tells it each inventory it records."""
        super().recorded(inv)
        self.use.on_inventory(inv)

    @precondition(lambda self: self.ready)
    @rule(busy=st.sampled_from(["held", "all", "none"]), util=st.sampled_from([60, None]))
    def use_pass(self, busy: str, util: int | None) -> None:
        """Every agent reports its GPUs' use — a process on each unit live bookings hold
        (`held`), on every unit (`all`, unbooked ones too), or on none — then a pass."""
        self.run(self._use_pass(busy, util))
        self.count(f"use pass ({busy})")

    async def _use_pass(self, busy: str, util: int | None) -> None:
        now = self.now
        view = await self.view()
        units = units_of(view)
        held = {
            (b.node_id, u)
            for b in view.bookings
            if b.start <= now < b.end
            for u in covered(view, b, units)
        }
        for host in self.hosts:
            mine = units.get(host.node_id, [])
            running = [
                u for u in mine if busy == "all" or (busy == "held" and (host.node_id, u) in held)
            ]
            devices = tuple(
                DeviceUse(
                    device_id=u,
                    sm_util=util,
                    processes=(ProcessUse(pid=1000 + i),) if u in running else (),
                )
                for i, u in enumerate(mine)
            )
            self.use.on_report(
                UseReport(
                    node_id=host.node_id,
                    pool_id=host.pool_id,
                    boot_id=f"boot-{host.boot}",
                    sent_at=now,
                    use_version=next(self.use_versions),
                    devices=devices,
                )
            )
            last = self.use_last.get(host.node_id)
            if last is not None and 0 < now - last <= GAP_MS:
                self.use_log += [(host.node_id, u, last, now) for u in running]
        await self.use.tick()
        self.use_last = {h.node_id: now for h in self.hosts}
        used = await self.credited()
        self.fail(misattributed(view, self.use_log, used, self.models), "a use pass")

    async def credited(self) -> dict[str, int]:
        """reservationId → the use the ledger credits it, in ms, all hours together."""
        used: dict[str, int] = {}
        for tenant_id in self.tenants:
            for b in await self.ledger.gpu_use.buckets(0, self.now + 2 * 60 * MINUTE, tenant_id):
                used[b.reservation_id] = used.get(b.reservation_id, 0) + b.used_ms
        return used


def units_of(view: LedgerView) -> dict[str, list[str]]:
    """node → the units its current GPU atoms report use under."""
    out: dict[str, list[str]] = {}
    for a in sorted(view.atoms.values(), key=lambda a: a.atom_id):
        if a.retired or a.cls not in GPU_CLASSES:
            continue
        unit = unit_of(a.cls, a.atom_id, a.device_id, a.attrs)
        got = out.setdefault(a.node_id, [])
        if unit not in got:
            got.append(unit)
    return out


def covered(view: LedgerView, b: BookingRow, units: Mapping[str, list[str]]) -> list[str]:
    """The units a booking covers: its atom's, or every unit of its node for a node."""
    if b.cls == "node":
        return list(units.get(b.node_id, []))
    atom = view.atoms.get(b.atom_id)
    if b.cls not in COVERING_CLASSES or atom is None:
        return []
    return [unit_of(atom.cls, atom.atom_id, atom.device_id, atom.attrs)]


def _length(spans: Iterable[tuple[int, int]]) -> int:
    total, reach = 0, None
    for start, end in sorted(spans):
        if reach is not None and end <= reach:
            continue
        lo = start if reach is None else max(start, reach)
        total += max(0, end - lo)
        reach = end
    return total


def _could_cover(view: LedgerView, b: BookingRow, node: str, unit: str) -> bool:
    if b.node_id != node or b.cls not in COVERING_CLASSES:
        return False
    if b.cls == "node":
        return True
    atom = view.atoms.get(b.atom_id)
    return atom is not None and unit_of(atom.cls, atom.atom_id, atom.device_id, atom.attrs) == unit


def misattributed(
    view: LedgerView, log: list[UseSpan], used: Mapping[str, int], models: Mapping[str, Any]
) -> list[str]:
    """Reservations credited more use than their booked time covers, or, as a unit's only
    holder, less than all of it."""
    by_rid: dict[str, list[BookingRow]] = {}
    for b in view.bookings:
        by_rid.setdefault(b.reservation_id, []).append(b)
    problems = []
    for rid in models:
        upper = lower = pieces = 0
        for b in by_rid.get(rid, []):
            spans = set()
            for node, unit, a, e in log:
                lo, hi = max(a, b.start), min(e, b.end)
                if node != b.node_id or hi <= lo or not _could_cover(view, b, node, unit):
                    continue
                pieces += 1
                if b.cls == "node":
                    spans.add((lo, hi))
                    continue
                upper += hi - lo
                others = [
                    (max(o.start, lo), min(o.end, hi))
                    for o in view.bookings
                    if o.reservation_id != rid and _could_cover(view, o, node, unit)
                ]
                lower += (hi - lo) - _length((s, t) for s, t in others if s < t)
            upper += sum(hi - lo for lo, hi in spans)
        got = used.get(rid, 0)
        slack = 4 * pieces + 4  # each piece of a pass is rounded down once or twice
        if got > upper + slack:
            problems.append(
                f"{rid} credited {got} ms of use; its booked time covers {upper} ms of the "
                "use on its GPUs (use credited to another reservation's time)"
            )
        elif got + slack < lower:
            problems.append(
                f"{rid} credited {got} ms of use; as its GPUs' only holder it used {lower} ms "
                "(its use credited elsewhere)"
            )
    return problems
