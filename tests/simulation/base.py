"""The simulation's state machine, its common part: the loop and ledger a test lends
it (`Glue`), the services it drives, each sequence's namespace (tenants, pools, nodes of
its own in the one database the test opened, so sequences cannot see each other), the
simulated hosts and how rules pick them — those holding bookings still to run first.

Hypothesis rules are synchronous and the ledger is async, so every rule runs its
coroutine on one event loop that the test owns (`Glue.runner`, an `asyncio.Runner`) and
that also owns the ledger's connections.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
from collections import Counter
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine

from coordinator.api.http.render import INTERVAL_ANSWERS, RESERVATION_ANSWERS
from coordinator.ledger import Database, Ledger
from coordinator.services import alerting
from coordinator.services.capacity_signal import CapacitySignal
from coordinator.services.intervals import IntervalBookings
from coordinator.services.maintenance import Maintenance
from coordinator.services.node_records import (
    NodeOutcome,
    NotRecorded,
    record_heartbeat,
    record_inventories,
    record_inventory,
)
from coordinator.services.reservations import Reservations
from coordinator.tasks.reservation_clock import ReservationClock
from shared.clock import FakeClock
from shared.ids import ulid
from shared.wire import Inventory
from tests.fakes import RecordingAlerts
from tests.simulation import reference as ref
from tests.simulation import reference_fit as fit
from tests.simulation.fleet import GpuMode, SimGpu, SimHost, SimNic
from tests.simulation.ledger_view import LedgerView, NodeRow, fingerprint, outbox_end, read_view

T = TypeVar("T")
NOTICE_MS = 120_000
GPU_FORMS: tuple[tuple[GpuMode, int], ...] = (
    ("mig", 2),
    ("mig", 3),
    ("slot", 2),
    ("slot", 4),
    ("whole", 1),
    ("slot", 1),
)
MINUTE = 60_000
MAX_HOSTS = 5
# Which device a rule picks, from a list with those under bookings still to run first:
# the first few as often as any, since changes under live bookings are what can break a
# promise.
DEVICE_INDEX = st.integers(0, 2) | st.integers(0, 15)


class InvariantViolation(AssertionError):
    """The ledger broke a rule of the reference model."""


@dataclass
class Glue:
    """What a test lends its machines: the loop, the ledger on it, a raw handle on the
    same database for the checker, counts of what the sequences did, and their trace:
    what each step did and left in the ledger, names and the ledger's random ids left
    out (`search.search` returns it; the replay test compares it between runs of one
    seed). `namespace` begins the names of every sequence run through it, so two glues
    can share a database."""

    runner: asyncio.Runner
    ledger: Ledger
    db: Database
    stats: Counter[str] = field(default_factory=Counter)
    namespace: str = "sim"
    trace: list[str] = field(default_factory=list)
    # A second coordinator replica's ledger on the same database (its own snapshot
    # cache), for the creates a sequence sends it (`straight_rules`).
    replica: Ledger | None = None

    def run(self, work: Awaitable[T]) -> T:
        return self.runner.run(work)  # type: ignore[arg-type]


def pick(items: list[T], i: int) -> T:
    return items[i % len(items)]


def device_id_of(dev: object) -> str:
    return dev.uuid if isinstance(dev, SimGpu) else dev.pci if isinstance(dev, SimNic) else ""


class MachineBase(RuleBasedStateMachine):
    glue: ClassVar[Glue]

    def __init__(self) -> None:
        super().__init__()
        g = self.glue
        g.stats["sequences"] += 1
        self.ledger, self.db = g.ledger, g.db
        # Names come from the glue and the sequence's place in it, never from the process
        # (`id()`, the wall clock, the position in the suite): a seed replays exactly.
        # The trailing `x` ends the prefix, so `sim1x` is in no name of `sim12x`.
        ns = f"{g.namespace}{g.stats['sequences']}x"
        self.ns = ns
        g.trace.append("sequence")
        self.clock = FakeClock()
        self.alerts = RecordingAlerts()
        self.capacity = CapacitySignal()
        self.reservations = Reservations(
            self.ledger, self.clock, self.alerts, self.capacity, RESERVATION_ANSWERS, NOTICE_MS
        )
        self.replica = Reservations(
            g.replica or self.ledger, self.clock, self.alerts, self.capacity,
            RESERVATION_ANSWERS, NOTICE_MS,
        )  # fmt: skip
        self.intervals = IntervalBookings(self.ledger, self.clock, self.capacity, INTERVAL_ANSWERS)
        self.maintenance = Maintenance(self.ledger, self.clock, self.alerts, self.capacity)
        self.res_clock = ReservationClock(self.ledger, self.clock, self.capacity, self.alerts)
        self.tenants = [f"{ns}a", f"{ns}b"]
        self.pools: list[str] = []
        self.hosts: list[SimHost] = []
        self.models: dict[str, ref.ReservationModel] = {}
        self.answers: list[tuple[dict[str, Any], int, Any]] = []  # body, status, answer
        self.ticks = [self.clock.now_ms()]
        self.keys = itertools.count()
        self.ready = False
        self.alerts_seen = 0
        self.outbox_seen = self.run(outbox_end(self.db))  # judge only the alerts after it
        self.outbox_ids: set[str] = set()
        self.at_risk: dict[str, bool] = {}
        # The forms each booked atom's device had when it was booked (`fit.fits`).
        self.booked_forms: fit.BookedForms = {}
        self.bodies: dict[str, dict[str, Any]] = {}  # reservationId → its create's body
        self.placed: dict[str, str] = {}  # nodeId → its pool after the last step

    # -- glue -----------------------------------------------------------------------------

    def run(self, work: Awaitable[T]) -> T:
        return self.glue.run(work)

    @property
    def now(self) -> int:
        return self.clock.now_ms()

    @property
    def racks(self) -> dict[str, str]:
        return {h.node_id: h.rack for h in self.hosts}

    def count(self, what: str) -> None:
        self.glue.stats[what] += 1
        self.glue.trace.append(what)
        event(what)

    def pool_ids(self) -> list[str]:
        """The sequence's two pools: ids as the ledger's own (`pool_` + a ULID), made
        from its namespace, the first always sorting first."""
        tail = hashlib.sha256(self.ns.encode()).digest()[:10]
        return [f"pool_{ulid(i, tail)}" for i in range(2)]

    def traced(self, view: LedgerView) -> None:
        """Add what the step left in the ledger to the trace."""
        names = {self.ns: "", **{p: f"pool{i}" for i, p in enumerate(self.pools)}}
        self.glue.trace.append(fingerprint(view, names))

    async def view(self) -> LedgerView:
        return await read_view(self.db, self.tenants, self.pools)

    def fail(self, violations: list[str], step: str) -> None:
        if violations:
            self.glue.stats["violations"] += len(violations)
            shown = "\n  ".join(violations[:20])
            raise InvariantViolation(f"after {step} at t={self.now}:\n  {shown}")

    async def _publish(self, changes: list[NodeOutcome]) -> None:
        await alerting.publish(self.alerts, changes, self.now)

    async def _register(self, host: SimHost) -> None:
        self.hosts.append(host)
        await self._inventory(host)

    def recorded(self, inv: Inventory) -> None:
        """An inventory the ledger recorded, told to the services that follow them as
        the coordinator's node watch tells them (`NodeWatch._recorded`)."""

    async def _inventory(self, host: SimHost) -> None:
        inv = host.inventory(self.now)
        await self._publish([await record_inventory(self.ledger, inv, self.now)])
        self.recorded(inv)
        await self._where_reported([host], "an inventory")

    async def _inventories(self, hosts: list[SimHost]) -> None:
        """The batched path (`record_inventories`, a fleet registering or restarting):
        new and known nodes in one unit of work, each as the single path would."""
        now = self.now
        inventories = [h.inventory(now) for h in hosts]
        outcomes = await record_inventories(self.ledger, inventories, now)
        refused = [o for o in outcomes if isinstance(o, NotRecorded)]
        self.fail([f"{o.node_id}: inventory not recorded: {o.error}" for o in refused], "a batch")
        for inv in inventories:
            self.recorded(inv)
        await self._publish([o for o in outcomes if isinstance(o, NodeOutcome)])
        # Nodes new in the batch may be recorded after the known ones: a known node's
        # move may be judged without their memory.
        fresh = frozenset(h.node_id for h in hosts) - self.placed.keys()
        await self._where_reported(hosts, "a batch of inventories", fresh)

    async def _where_reported(
        self, hosts: list[SimHost], step: str, fresh: frozenset[str] = frozenset()
    ) -> None:
        """SPEC §5 pool moves: without bookings still to run, a node is where its agent
        says (or held for its pool's memory, counting or not the nodes `fresh` in the
        same change)."""
        held = (await self._held_devices())[0]
        view = await self.view()
        nodes = view.nodes
        self.fail(
            [
                f"{h.node_id} holds no bookings and is not in the pool its agent "
                f"reports ({h.pool_id})"
                for h in hosts
                if h.node_id not in held
                and (h.node_id not in nodes or nodes[h.node_id].pool_id != h.pool_id)
                and not _needed_for_pool_memory(view, h.node_id, self.now)
                and not _needed_for_pool_memory(view, h.node_id, self.now, fresh)
            ],
            step,
        )

    async def _heartbeat(self, host: SimHost) -> None:
        changes = await record_heartbeat(self.ledger, host.heartbeat(self.now), self.now)
        if changes is not None:
            await self._publish([changes])

    # -- the fleet changes -------------------------------------------------------------------
    # Rules pick hosts and devices by index from lists that put those holding bookings
    # still to run first: the changes that matter are the ones under live bookings, and
    # hypothesis tries small indices first.

    async def _held_devices(self) -> tuple[set[str], set[tuple[str, str]]]:
        """Node ids and (node id, device id) pairs holding bookings that have not ended
        (device ids are per node: every host has a NIC at 0000:40:00.0)."""
        view = await self.view()
        nodes: set[str] = set()
        devices: set[tuple[str, str]] = set()
        for b in view.bookings:
            if b.end > self.now and b.end > b.start:
                nodes.add(b.node_id)
                atom = view.atoms.get(b.atom_id)
                if atom is not None and atom.device_id:
                    devices.add((b.node_id, atom.device_id))
        nodes |= {s.node_id for s in view.scalars if s.node_id and s.end > self.now}
        return nodes, devices

    def _hosts(self, held: set[str]) -> list[SimHost]:
        return sorted(self.hosts, key=lambda h: (h.node_id not in held, h.node_id))

    def _devices(self, held: set[tuple[str, str]], kind: type[T]) -> list[tuple[SimHost, T]]:
        found = [
            ((h.node_id, device_id_of(d)), (h, d))
            for h in self.hosts
            for d in (*h.gpus, *h.nics)
            if isinstance(d, kind)
        ]
        return [hd for key, hd in sorted(found, key=lambda f: (f[0] not in held, f[0]))]

    def host(self, i: int) -> SimHost:
        return pick(self._hosts(self.run(self._held_devices())[0]), i)

    def device(self, i: int, kind: type[T]) -> tuple[SimHost, T]:
        return pick(self._devices(self.run(self._held_devices())[1], kind), i)

    async def _book_forms(
        self,
        host: SimHost,
        dev: SimGpu | SimNic,
        count: int,
        *,
        spot: bool,
        later: int | None,
        straight: bool = False,
    ) -> None:
        """Book forms of one device (`booking_rules.BookingRules`)."""
        raise NotImplementedError

    async def _create(
        self,
        body: dict[str, Any],
        shape: str,
        *,
        straight: bool = False,
        via: Reservations | None = None,
    ) -> None:
        """Create, and judge the answer (`booking_rules.BookingRules`)."""
        raise NotImplementedError

    async def _intervals(self, tenant_id: str, body: dict[str, Any], pool_id: str) -> None:
        """Book intervals, and judge the answer (`booking_rules.BookingRules`)."""
        raise NotImplementedError

    async def _pool_move(self, host: SimHost) -> None:
        """The host's agent reports the other pool (`fleet_rules.FleetRules`)."""
        raise NotImplementedError

    async def _maintenance(self, node_id: str, on: bool) -> None:
        """`nodes.setMaintenance` (`fleet_rules.FleetRules`)."""
        raise NotImplementedError


def _in_service(node: NodeRow) -> bool:
    return (
        node.reachable
        and not node.maintenance
        and not node.provisioning
        and node.health not in ("unhealthy", "unmonitored")
    )


def _needed_for_pool_memory(
    view: LedgerView, node_id: str, now: int, absent: frozenset[str] = frozenset()
) -> bool:
    """The reference's own reading of interval memory under a pool move (docs/api.md):
    a node stays in its pool while the pool's memory commitments from now on — the
    interval API's pool-wide reservations plus memory booked on its other nodes — peak
    above what its other in-service nodes have."""
    node = view.nodes.get(node_id)
    if node is None:
        return False
    pool = node.pool_id
    memory = [s for s in view.scalars if s.pool_id == pool and s.resource == "memoryGiB"]
    if not any(s.node_id == "" and s.end > now for s in memory):
        return False
    others = [
        n
        for n in view.nodes.values()
        if n.pool_id == pool and n.node_id != node_id and n.node_id not in absent
    ]
    have = sum(n.scalars.get("memoryGiB", 0) for n in others if _in_service(n))
    spans = [
        (max(s.start, now), s.end, s.amount) for s in memory if s.end > now and s.node_id != node_id
    ]
    points = sorted({start for start, _, _ in spans})
    peak = max((sum(a for b, e, a in spans if b <= t < e) for t in points), default=0)
    return peak > have


def left_short(before: Mapping[str, str], view: LedgerView, now: int) -> list[str]:
    """The converse of `_needed_for_pool_memory` (issue 31): a node that left a pool since
    `before` (node → pool) left it able to keep what its interval reservations promise —
    the pool's memory commitments from now on (pool-wide, and node-level on its nodes in
    service) peak at most at what its nodes in service have, the node's own memory no
    longer counted."""
    problems = []
    for node_id, pool in sorted(before.items()):
        node = view.nodes.get(node_id)
        if node is None or node.pool_id == pool:
            continue
        memory = [
            s
            for s in view.scalars
            if s.pool_id == pool and s.resource == "memoryGiB" and s.end > now and s.end > s.start
        ]
        if not any(s.node_id == "" for s in memory):
            continue
        members = {n.node_id: n for n in view.nodes.values() if n.pool_id == pool}
        have = sum(n.scalars.get("memoryGiB", 0) for n in members.values() if _in_service(n))
        spans = [
            (max(s.start, now), s.end, s.amount)
            for s in memory
            if s.node_id == "" or (s.node_id in members and _in_service(members[s.node_id]))
        ]
        points = sorted({start for start, _, _ in spans})
        peak = max((sum(a for b, e, a in spans if b <= t < e) for t in points), default=0)
        if peak > have:
            problems.append(
                f"{node_id} left {pool}, whose memory commitments peak at {peak} GiB, above "
                f"the {have} GiB its nodes in service have without it"
            )
    return problems
