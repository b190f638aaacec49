"""Use service (SPEC §10): keeps what each node's GPUs run (`domain.gpu_use_book`) from
heartbeat deltas and full use reports, asks an agent for a full report when its delta
does not apply, and on the leader's `use` loop joins use with the live bookings
(`domain.gpu_use_join`, in a thread) and accrues used time (`domain.gpu_use_accrual`). A pass's
node events and alerts are written at once; accrued time is kept in memory and written
with them every `flush_ms` (one upsert per hour, reservation and unit, not one a pass).

Ingest callbacks touch memory only. Use requests go out like inventory requests: at
most once per node per `USE_REQUEST_EVERY_MS`, at most `USE_REQUESTS_PER_S` a second
in all. A node's use counts only while the node is reachable and its use is no older
than `stale_ms`; the time between two passes is credited only up to `max_gap_ms`, so
a coordinator that was away or a node that fell silent credits nothing for the gap.

Every replica keeps `unbooked`, the units in unbooked use it last saw, which its placer
takes last: the leader from its join, any other replica from its own `follow` loop (its
book is as warm as the leader's: every replica hears every heartbeat; it reads the live
bookings and judges nothing else).

Use is a condition (issue 34): `gpu.unbookedUse`, `gpu.foreignUse` and
`reservation.idle` are said when they start and ended (`gpu.unbookedUseEnded`,
`gpu.foreignUseEnded`, `reservation.inUse`) when they stop. The ones said and not ended
are kept in the ledger with the alerts that say them (`domain.gpu_use_conditions`); a
replica that starts leading (a new leader term) takes its marks from there before its
first pass, so across a leader change each condition is said once and ended once. Idle
clocks not yet said live in memory only: a new leader starts them at its first pass. A
replica that does not lead shows a reservation's idle mark (`idle_since`, for
reservations.get/list) as the ledger has it, read at each `follow` pass: said ones only.

What a host sends is bounded (issue 32): its use counts only for the units its recorded
inventory has (`domain.gpu_use_book`: others dropped, counted by the node watch as
`unknown_device`); an owner is believed only when it names a live reservation, and a
unit has a bounded number of owners (`domain.gpu_use_owners`); each unit's use alerts
are rate limited, the held ones said as one (`domain.gpu_use_gate`).

Memory use (issue 35): each pass charges the host memory of each node's owners
(`OwnerMemory`, in the book) to a tenant, through the owner's live reservation, else
the operator's mapping `rules` (`domain.tenant_rules`), else to nobody (kept apart as
unattributed), and writes it with the accrued time (`domain.consumption`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from coordinator.domain.consumption import MemoryAccrued, MemoryKey, accrue_memory, merge_memory
from coordinator.domain.gpu_use_accrual import AccrualKey, Accrued, accrue, merge
from coordinator.domain.gpu_use_book import Applied, GpuUseBook, inventory_units
from coordinator.domain.gpu_use_conditions import IdleLine, changes, idle_lines, state_of
from coordinator.domain.gpu_use_gate import Gate, gate
from coordinator.domain.gpu_use_join import JoinState, UseTransition, join
from coordinator.domain.gpu_use_owners import RESERVATION_ID, reservation_owners, vetted
from coordinator.domain.gpu_use_units import Policy, UnitLine, covers, unbooked_units, unit_lines
from coordinator.domain.model import NewNodeEvent
from coordinator.domain.ports import AlertSink, Publisher
from coordinator.domain.tenant_rules import NO_RULES, TenantRules
from coordinator.ledger import Ledger
from coordinator.services import alerting
from shared.clock import Clock
from shared.ids import ulid
from shared.subjects import Subjects
from shared.wire import Alert, DeviceUse, Heartbeat, Inventory, UseReport

log = logging.getLogger(__name__)

USE_REQUEST_EVERY_MS = 5000
USE_REQUESTS_PER_S = 200
# Accrued keys kept in memory before they are written whatever the time.
MAX_PENDING = 200_000
# Kinds also recorded as the node's events (the reservation kinds are the holder's).
NODE_EVENT_KINDS = frozenset(
    {"gpu.unbookedUse", "gpu.foreignUse", "gpu.unbookedUseEnded", "gpu.foreignUseEnded"}
)
# Not yet taken from the ledger (any term, None included, differs from it).
_UNLOADED = object()


# A GPU use start → the kind that ends it, named in its alert (`details.ends`): a
# subscriber tells these conditions from the one-shot use events of older coordinators.
ENDED_BY = {"gpu.unbookedUse": "gpu.unbookedUseEnded", "gpu.foreignUse": "gpu.foreignUseEnded"}


def alert_of(t: UseTransition, now: int) -> Alert:
    ends = {"ends": ENDED_BY[t.kind]} if t.kind in ENDED_BY else {}
    return Alert(
        alert_id=ulid(now), kind=t.kind, pool_id=t.pool_id, node_id=t.node_id, at=now,
        reason=t.reason, since=now, device_id=t.device_id, reservation_id=t.reservation_id,
        details=dict(t.details) | ends,
    )  # fmt: skip


class GpuUseWatch:
    def __init__(
        self,
        ledger: Ledger,
        subjects: Subjects,
        clock: Clock,
        bus: Publisher,
        alerts: AlertSink,
        reachable: Callable[[str], bool],
        policy: Policy | None = None,
        stale_ms: int = 60_000,
        max_gap_ms: int = 60_000,
        flush_ms: int = 60_000,
        term: Callable[[], int | None] = lambda: None,
        rules: TenantRules = NO_RULES,
    ) -> None:
        self.ledger = ledger
        self.rules = rules  # the operator's owner → tenant mapping, for memory use
        # The leader term this replica's marks were taken from the ledger in.
        self.term = term
        self._term: object = _UNLOADED
        self.subjects = subjects
        self.clock = clock
        self.bus = bus
        self.alerts = alerts
        self.reachable = reachable
        self.policy = policy or Policy()
        self.stale_ms = stale_ms
        self.max_gap_ms = max_gap_ms
        self.book = GpuUseBook()
        self.state = JoinState()
        self.gates: dict[tuple[str, str], Gate] = {}
        self.lines: tuple[UnitLine, ...] = ()
        self.idle: tuple[IdleLine, ...] = ()  # reservations said idle (the metrics)
        # Whether this replica's last pass was the leader's (`tick`) or a follower's; a
        # follower's idle marks are the ledger's (`said_idle`), read at each `follow`.
        self.leading = False
        self.said_idle: dict[str, int] = {}
        # (node, unit) in unbooked use as this replica last saw it (the placer's `busy`).
        self.unbooked: frozenset[tuple[str, str]] = frozenset()
        self._accrued_at: dict[str, int] = {}
        # Accrued time not yet written: written every `flush_ms` (a leader that dies
        # loses at most that much accounting), with a pass's alerts at once.
        self.flush_ms = flush_ms
        self._pending: dict[AccrualKey, Accrued] = {}
        self._pending_memory: dict[MemoryKey, MemoryAccrued] = {}
        self._flushed_at = 0
        self._wanted: dict[str, str] = {}  # node → pool, waiting for a full report
        self._requested: dict[str, int] = {}
        self._window = (0, 0)  # (second, requests sent in it)
        self.requests_sent = 0

    # -- ingest callbacks: memory only -----------------------------------------------

    def idle_since(self, reservation_id: str) -> int | None:
        """Since when every unit the reservation holds has been idle: on the leader as
        its last join saw it (None while in use or not judged); on another replica as
        said (`reservation.idle` not yet ended), as of its last `follow` pass."""
        if not self.leading:
            return self.said_idle.get(reservation_id)
        idle = self.state.idle.get(reservation_id)
        return idle.since if idle is not None and idle.judged else None

    def on_heartbeat(self, hb: Heartbeat) -> int:
        """A heartbeat the liveness tracker accepted, carrying use (`use_version` > 0);
        how many of its devices the node's inventory does not have (dropped)."""
        applied, unknown = self.book.on_heartbeat(hb, self.clock.now_ms())
        if applied is Applied.NEEDS_REPORT:
            self._wanted[hb.node_id] = hb.pool_id
        return unknown

    def on_report(self, report: UseReport) -> int:
        """A full report of a known node; how many of its devices the node's inventory
        does not have (dropped)."""
        unknown = self.book.on_report(report, self.clock.now_ms())
        self._wanted.pop(report.node_id, None)
        return unknown

    def on_inventory(self, inv: Inventory) -> None:
        """The node's inventory as recorded (or, on a follower, as heard): its units are
        the devices its use may name. When they change, a full report is asked for: use
        of a new unit that arrived before the inventory was recorded was dropped."""
        changed = self.book.set_units(inv.node_id, inventory_units(inv))
        if changed and inv.node_id in self.book.nodes:
            self._wanted[inv.node_id] = inv.pool_id

    async def load(self) -> None:
        """Each node's units as the ledger has them (before the bus delivers any use)."""
        for node_id, units in (await self.ledger.gpu_use.units()).items():
            self.book.set_units(node_id, units)

    # -- loops -----------------------------------------------------------------------

    async def request_reports(self) -> None:
        """Ask each node whose delta did not apply for its full report (rate-limited)."""
        now = self.clock.now_ms()
        if len(self._requested) > 10_000:
            cutoff = now - USE_REQUEST_EVERY_MS
            self._requested = {n: t for n, t in self._requested.items() if t > cutoff}
        for node_id, pool_id in list(self._wanted.items()):
            if now - self._requested.get(node_id, -USE_REQUEST_EVERY_MS) < USE_REQUEST_EVERY_MS:
                continue
            second, sent = self._window
            if now // 1000 != second:
                second, sent = now // 1000, 0
            if sent >= USE_REQUESTS_PER_S:
                return
            self._window = (second, sent + 1)
            self._requested[node_id] = now
            try:
                await self.bus.publish(self.subjects.use_request(pool_id, node_id), b"{}")
                self.requests_sent += 1
            except Exception as exc:
                log.warning("could not ask %s for its use: %s", node_id, exc)

    def _current(self, now: int) -> dict[str, dict[str, DeviceUse]]:
        """The use of each node whose use is current, copied (ingest changes the book
        while a pass runs in its thread)."""
        return {
            n.node_id: dict(n.devices)
            for n in self.book
            if now - n.updated_at <= self.stale_ms and self.reachable(n.node_id)
        }

    async def follow(self) -> None:
        """On a replica that is not the leader: which units are in unbooked use now, from
        its own book and the live bookings (no alerts, no accrual, no marks), and the
        idle marks said (`idle_since`)."""
        now = self.clock.now_ms()
        self.leading = False
        self.said_idle = await self.ledger.gpu_use.said_idle()
        # Only nodes running something can have a unit in unbooked use.
        uses = {
            node_id: devices
            for node_id, devices in self._current(now).items()
            if any(d.processes for d in devices.values())
        }
        holds = await self.ledger.gpu_use.holds(uses, now) if uses else []
        self.unbooked = unbooked_units(uses, holds)

    async def tick(self) -> None:
        """One pass: join and accrue (off the event loop: a large fleet's pass takes a
        fraction of a second of CPU), write the alerts at once and the accrued time every
        `flush_ms`, then announce the alerts."""
        now = self.clock.now_ms()
        self.leading = True
        term = self.term()
        if term != self._term:
            # Leading in a new term: go on from the conditions said (by whichever leader),
            # not from what this replica remembers of an older term.
            self.state = state_of(await self.ledger.gpu_use.conditions())
            self.gates = {}
            self._term = term
        uses = self._current(now)
        held_memory = {n.node_id: n.take_memory() for n in self.book if n.node_id in uses}
        rules = self.rules
        if rules.rules:  # a rule applies once its tenant exists (domain.tenant_rules)
            rules = rules.only({t.tenant_id for t in await self.ledger.tenants.list()})
        pools = {n.node_id: n.pool_id for n in self.book}
        windows = {}
        for node_id in uses:
            last = self._accrued_at.get(node_id)
            if last is not None and 0 < now - last <= self.max_gap_ms:
                windows[node_id] = (last, now)
        # The bookings of the whole time since the last pass, for accrual (use up to a
        # reservation's end is its own); the live ones, for the join.
        since = min((a for a, _ in windows.values()), default=now)
        spanned = await self.ledger.gpu_use.holds(uses, now, since)
        holds = [h for h in spanned if h.start <= now < h.end]
        held_ids = {h.reservation_id for h in holds}
        owners = reservation_owners(uses) - held_ids
        owners |= {
            m.owner
            for entries in held_memory.values()
            for m in entries
            if m.owner_kind == "reservation" and RESERVATION_ID.match(m.owner)
        }
        tenant_of = await self.ledger.gpu_use.tenants_of(owners | held_ids, now)
        # Owners as believed: a process naming no live reservation is nobody's.
        holders = {k: {h.reservation_id for h in hs} for k, hs in covers(holds).items()}
        uses = vetted(uses, tenant_of.keys() | held_ids, holders)
        # Reservations with an idle clock that no current node holds: still live elsewhere,
        # or ended (which clears their idleness).
        spread = await self.ledger.gpu_use.spread(held_ids | set(self.state.idle), now)

        def compute() -> tuple[
            JoinState,
            dict[tuple[str, str], Gate],
            list[UseTransition],
            dict[AccrualKey, Accrued],
            dict[MemoryKey, MemoryAccrued],
        ]:
            state, transitions = join(
                self.state, uses, holds, pools, now, self.policy, tenant_of, spread
            )
            gates, said = gate(self.gates, transitions, now, self.policy)
            booked = {(h.node_id, h.reservation_id) for h in holds}
            memory = accrue_memory(held_memory, tenant_of, pools, windows, rules, booked)
            accrued = accrue(
                uses, spanned, pools, windows, self.policy.idle_util_percent, tenant_of
            )
            return state, gates, said, accrued, memory

        state, gates, transitions, accrued, memory = await asyncio.to_thread(compute)
        alerts = [alert_of(t, now) for t in transitions if t.kind in alerting.PUBLISHED]
        events = [
            NewNodeEvent(t.node_id, t.pool_id, t.kind, t.reason, now, t.device_id)
            for t in transitions
            if t.kind in NODE_EVENT_KINDS
        ]
        # Copies: `merge` adds into the values, and until the write commits the held
        # ones must stay as they were (a failed pass's time comes again next pass).
        pending: dict[AccrualKey, Accrued] = {}
        merge(pending, self._pending)
        merge(pending, accrued)
        pending_memory = {
            k: MemoryAccrued(v.mib_ms, v.peak_mib) for k, v in self._pending_memory.items()
        }
        merge_memory(pending_memory, memory)
        flush = now - self._flushed_at >= self.flush_ms or len(pending) > MAX_PENDING
        opened, closed = changes(transitions, now)
        await self.ledger.gpu_use.record(
            pending if flush else {}, events, alerts, opened, closed,
            memory=pending_memory if flush else {},
        )  # fmt: skip
        # Committed: only now does memory move on.
        self._pending = {} if flush else pending
        self._pending_memory = {} if flush else pending_memory
        if flush:
            self._flushed_at = now
        self.state = state
        self.gates = gates
        self.unbooked = state.unbooked | state.chosen  # in use either way, for placement
        self._accrued_at = dict.fromkeys(uses, now)
        self.lines = unit_lines(uses, holds, pools)
        self.idle = idle_lines(state)
        await alerting.announce(self.alerts, alerts)
