"""The ledger simulation as a hypothesis state machine: random sequences of fleet
changes, bookings and clock moves driven through the real services and ledger, the
reference model (`reference.py`) checked after every step.

Hypothesis rules are synchronous and the ledger is async, so every rule runs its
coroutine on one event loop that the test owns (`Glue.runner`, an `asyncio.Runner`) and
that also owns the ledger's connections. Each sequence gets tenants, pools and nodes of
its own (a fresh namespace) in the one database the test opened, so sequences cannot see
each other and no database is created per sequence.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from coordinator.api.render import INTERVAL_ANSWERS, RESERVATION_ANSWERS, reservation
from coordinator.capacity_signal import CapacitySignal
from coordinator.domain.clock import FakeClock
from coordinator.domain.model import Quota
from coordinator.domain.reservation import Reservation
from coordinator.errors import InvalidInput, Unavailable
from coordinator.ledger import Database, Ledger, ReservationFilter
from coordinator.ledger.database import lock_pool
from coordinator.ledger.rollups import rebuild_pool
from coordinator.services import alerting
from coordinator.services.idempotent import Replayed
from coordinator.services.intervals import IntervalBookings, IntervalsBooked, IntervalsRefused
from coordinator.services.maintenance import Maintenance
from coordinator.services.node_changes import (
    NodeChanges,
    NotRecorded,
    record_heartbeat,
    record_inventories,
    record_inventory,
    record_reachability,
)
from coordinator.services.reservations import Created, Refused, Reservations
from coordinator.tasks.reservation_clock import ReservationClock
from shared.ids import new_pool_id
from shared.wire import Alert
from tests.simulation import reference as ref
from tests.simulation.fleet import GpuMode, Health, SimGpu, SimHost, SimNic
from tests.simulation.ledger_view import LedgerView, outbox_end, read_outbox, read_view
from tests.simulation.requests import RESOURCES, SHAPES, create_body, create_request, interval_body

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
_namespaces = itertools.count()


class InvariantViolation(AssertionError):
    """The ledger broke a rule of the reference model."""


class RecordingAlerts:
    def __init__(self) -> None:
        self.alerts: list[Alert] = []

    async def publish(self, alert: Alert) -> None:
        self.alerts.append(alert)


@dataclass
class Glue:
    """What a test lends its machines: the loop, the ledger on it, a raw handle on the
    same database for the checker, and counts of what the sequences did."""

    runner: asyncio.Runner
    ledger: Ledger
    db: Database
    stats: Counter[str]

    def run(self, work: Awaitable[T]) -> T:
        return self.runner.run(work)  # type: ignore[arg-type]


def _pick(items: list[T], i: int) -> T:
    return items[i % len(items)]


def _device_id(dev: object) -> str:
    return dev.uuid if isinstance(dev, SimGpu) else dev.pci if isinstance(dev, SimNic) else ""


class LedgerMachine(RuleBasedStateMachine):
    glue: ClassVar[Glue]

    def __init__(self) -> None:
        super().__init__()
        g = self.glue
        g.stats["sequences"] += 1
        self.ledger, self.db = g.ledger, g.db
        ns = f"sim{next(_namespaces)}x{id(self) % 10_000}"
        self.ns = ns
        self.clock = FakeClock()
        self.alerts = RecordingAlerts()
        self.capacity = CapacitySignal()
        self.reservations = Reservations(
            self.ledger, self.clock, self.alerts, self.capacity, RESERVATION_ANSWERS, NOTICE_MS
        )
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

    # -- glue -----------------------------------------------------------------------------

    def run(self, work: Awaitable[T]) -> T:
        return self.glue.run(work)

    @property
    def now(self) -> int:
        return self.clock.now_ms()

    def count(self, what: str) -> None:
        self.glue.stats[what] += 1
        event(what)

    async def view(self) -> LedgerView:
        return await read_view(self.db, self.tenants, self.pools)

    def fail(self, violations: list[str], step: str) -> None:
        if violations:
            self.glue.stats["violations"] += len(violations)
            shown = "\n  ".join(violations[:20])
            raise InvariantViolation(f"after {step} at t={self.now}:\n  {shown}")

    async def _publish(self, changes: list[NodeChanges]) -> None:
        await alerting.publish(self.alerts, changes, self.now)

    # -- setup ----------------------------------------------------------------------------

    @initialize(
        gpu_quota=st.sampled_from([None, 3, 5]),
        memory_quota=st.sampled_from([None, 48, 96]),
        b_pool_memory=st.sampled_from([None, 32]),
        preload=st.sampled_from([True, False]),
    )
    def setup(
        self,
        gpu_quota: int | None,
        memory_quota: int | None,
        b_pool_memory: int | None,
        preload: bool,
    ) -> None:
        self.run(self._setup(gpu_quota, memory_quota, b_pool_memory, preload))

    async def _setup(
        self,
        gpu_quota: int | None,
        memory_quota: int | None,
        b_pool_memory: int | None,
        preload: bool,
    ) -> None:
        led, now = self.ledger, self.now
        a, b = self.tenants
        await led.tenants.create(a, "Sim A", now)
        await led.tenants.create(b, "Sim B", now)
        self.pools = [new_pool_id(), new_pool_id()]
        for pool_id in self.pools:
            await led.pools.create(pool_id, "sim", a, None, now)
        await led.pools.offer(self.pools[0], b, now)
        if gpu_quota is not None:
            await led.quotas.set(Quota(a, None, "gpu", gpu_quota), now)
        if memory_quota is not None:
            await led.quotas.set(Quota(a, None, "memoryGiB", memory_quota), now)
        if b_pool_memory is not None:
            await led.quotas.set(Quota(b, self.pools[0], "memoryGiB", b_pool_memory), now)
        # Every shape is bookable from the start: whole GPUs everywhere, a MIG-partitioned
        # and a time-sliced GPU, a NIC with VFs and one without, two nodes in one rack.
        for i, (pool, rack) in enumerate(((0, "r0"), (0, "r0"), (1, "r1"))):
            host = SimHost.build(f"{self.ns}-n{i}", self.pools[pool], rack, 3 - pool, 1)
            if i == 0:
                host.gpus[-1].mode, host.gpus[-1].parts = "mig", 2
            if i == 1:
                host.gpus[-1].mode, host.gpus[-1].parts = "slot", 2
            host.nics[0].vfs = 2 if i != 1 else 0
            await self._register(host)
        self.ready = True
        if preload:
            # A fleet is rarely idle: one form of every device kind is held from the
            # start (a whole GPU, a MIG instance, a slot, a VF; one spot), so the first
            # fleet change already happens under bookings.
            n0, n1, n2 = self.hosts
            for host, dev, spot in (
                (n0, n0.gpus[0], False),
                (n0, n0.gpus[-1], False),
                (n1, n1.gpus[-1], True),
                (n2, n2.nics[0], False),
            ):
                await self._book_forms(host, dev, 1, spot=spot, later=None)

    async def _register(self, host: SimHost) -> None:
        self.hosts.append(host)
        await self._inventory(host)

    async def _inventory(self, host: SimHost) -> None:
        await self._publish(
            [await record_inventory(self.ledger, host.inventory(self.now), self.now)]
        )
        await self._where_reported([host], "an inventory")

    async def _inventories(self, hosts: list[SimHost]) -> None:
        """The batched path (`record_inventories`, a fleet registering or restarting):
        new and known nodes in one unit of work, each as the single path would."""
        now = self.now
        outcomes = await record_inventories(self.ledger, [h.inventory(now) for h in hosts], now)
        refused = [o for o in outcomes if isinstance(o, NotRecorded)]
        self.fail([f"{o.node_id}: inventory not recorded: {o.error}" for o in refused], "a batch")
        await self._publish([o for o in outcomes if isinstance(o, NodeChanges)])
        await self._where_reported(hosts, "a batch of inventories")

    async def _where_reported(self, hosts: list[SimHost], step: str) -> None:
        """SPEC §5 pool moves: without bookings still to run, a node is where its agent
        says."""
        held = (await self._held_devices())[0]
        nodes = (await self.view()).nodes
        self.fail(
            [
                f"{h.node_id} holds no bookings and is not in the pool its agent "
                f"reports ({h.pool_id})"
                for h in hosts
                if h.node_id not in held
                and (h.node_id not in nodes or nodes[h.node_id].pool_id != h.pool_id)
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
            ((h.node_id, _device_id(d)), (h, d))
            for h in self.hosts
            for d in (*h.gpus, *h.nics)
            if isinstance(d, kind)
        ]
        return [hd for key, hd in sorted(found, key=lambda f: (f[0] not in held, f[0]))]

    def host(self, i: int) -> SimHost:
        return _pick(self._hosts(self.run(self._held_devices())[0]), i)

    def device(self, i: int, kind: type[T]) -> tuple[SimHost, T]:
        return _pick(self._devices(self.run(self._held_devices())[1], kind), i)

    @precondition(lambda self: self.ready and len(self.hosts) < MAX_HOSTS)
    @rule(
        pool=st.integers(0, 1),
        rack=st.sampled_from(["r0", "r1"]),
        gpus=st.integers(1, 3),
        nics=st.integers(0, 1),
    )
    def add_node(self, pool: int, rack: str, gpus: int, nics: int) -> None:
        host = SimHost.build(f"{self.ns}-n{len(self.hosts)}", self.pools[pool], rack, gpus, nics)
        self.run(self._register(host))
        self.count("node added")

    @precondition(lambda self: self.ready)
    @rule(i=st.integers(0, 15), form=st.integers(0, 5), then_book=st.sampled_from([True, False]))
    def reconfigure(self, i: int, form: int, then_book: bool) -> None:
        """Change a device's form: a GPU to MIG (2 or 3 instances, new ones every time),
        time-slice slots (2, 4 or 1 replicas, the same ids for the same slots) or whole; a
        NIC to 0-3 VFs. With `then_book` a tenant at once asks for every form the device
        now shows — which must not be free where its old forms are still booked."""
        host, dev = self.device(i, object)
        if isinstance(dev, SimGpu):
            dev.mode, dev.parts = GPU_FORMS[form]
            dev.generation += 1
            self.count(f"gpu reconfigured to {dev.mode}")
        elif isinstance(dev, SimNic):
            dev.vfs = form % 4
            self.count("nic reconfigured")
        else:
            return
        self.run(self._reconfigured(host, dev, then_book))

    async def _reconfigured(self, host: SimHost, dev: SimGpu | SimNic, then_book: bool) -> None:
        device = _device_id(dev)
        live = (host.node_id, device) in (await self._held_devices())[1]
        await self._inventory(host)
        if then_book:
            await self._book_forms(host, dev, 3, spot=False, later=None)
        if live:
            events = [
                e
                for e in (await self.view()).events
                if e.kind == "device.reconfigured" and e.device_id == device and e.at == self.now
            ]
            self.fail(
                []
                if events
                else [
                    f"{device} on {host.node_id} changed form under live "
                    "bookings and no device.reconfigured event was recorded"
                ],
                "reconfiguration",
            )

    @precondition(lambda self: self.ready)
    @rule(i=st.integers(0, 15))
    def lose_or_restore_device(self, i: int) -> None:
        host, dev = self.device(i, object)
        dev.present = not dev.present  # type: ignore[attr-defined]
        self.run(self._inventory(host))
        self.count("device lost" if not dev.present else "device back")  # type: ignore[attr-defined]

    @precondition(lambda self: self.ready)
    @rule(
        i=st.integers(0, 15),
        status=st.sampled_from(["unhealthy", "healthy", "degraded", "unmonitored"]),
        by_inventory=st.booleans(),
    )
    def device_health(self, i: int, status: Health, by_inventory: bool) -> None:
        host, dev = self.device(i, object)
        dev.health = status  # type: ignore[attr-defined]
        self.run(self._inventory(host) if by_inventory else self._heartbeat(host))
        self.count(f"device {status}")

    @precondition(lambda self: self.ready)
    @rule(
        h=st.integers(0, 9),
        status=st.sampled_from(["healthy", "unhealthy", "degraded", "unmonitored"]),
        provisioning=st.sampled_from([False, False, False, True]),
    )
    def node_health(self, h: int, status: Health, provisioning: bool) -> None:
        host = self.host(h)
        host.health, host.provisioning = status, provisioning
        self.run(self._heartbeat(host))
        self.count(f"node {status}" + (" provisioning" if provisioning else ""))

    @precondition(lambda self: self.ready)
    @rule(h=st.integers(0, 9), reachable=st.sampled_from([False, True]))
    def reachability(self, h: int, reachable: bool) -> None:
        host = self.host(h)
        self.run(self._reachability(host.node_id, reachable))
        self.count("reachable" if reachable else "unreachable")

    async def _reachability(self, node_id: str, reachable: bool) -> None:
        await self._publish(await record_reachability(self.ledger, [node_id], reachable, self.now))

    @precondition(lambda self: self.ready)
    @rule(h=st.integers(0, 9), on=st.sampled_from([True, False]))
    def maintenance_change(self, h: int, on: bool) -> None:
        host = self.host(h)
        self.run(self._maintenance(host.node_id, on))
        self.count("maintenance on" if on else "maintenance off")

    async def _maintenance(self, node_id: str, on: bool) -> None:
        """`nodes.setMaintenance` answers with the number of reservations it put at risk:
        those whose flag it switched on."""
        before = await self._flagged()
        out = await self.maintenance.set(node_id, on, "simulated work", "operator/sim")
        after = await self._flagged()
        put = len(after - before)
        self.fail(
            []
            if out.reservations_at_risk == put
            else [
                f"maintenance {on} on {node_id} answered {out.reservations_at_risk} put at "
                f"risk, {put} reservations were ({sorted(after - before)})"
            ],
            "maintenance",
        )

    async def _flagged(self) -> set[str]:
        """Our reservations that carry an `atRisk` flag now."""
        now, out = self.now, set()
        for tenant_id in self.tenants:
            page = await self.ledger.listing.page(ReservationFilter(tenant_id), None, 1000, now)
            out |= {r.reservation_id for r in page if r.live(now) and r.at_risk is not None}
        return out

    @precondition(lambda self: self.ready)
    @rule(h=st.integers(0, 9), move=st.booleans(), new=st.booleans())
    def inventories_batch(self, h: int, move: bool, new: bool) -> None:
        """Agents restarting together: two known nodes (the first maybe into the other
        pool) and, while there is room, a new one, through the batched path."""
        hosts = self._hosts(self.run(self._held_devices())[0])
        batch = [_pick(hosts, h), _pick(hosts, h + 1)]
        if move:
            batch[0].pool_id = next(p for p in self.pools if p != batch[0].pool_id)
            batch[0].boot += 1
        if new and len(self.hosts) < MAX_HOSTS:
            host = SimHost.build(f"{self.ns}-n{len(self.hosts)}", self.pools[h % 2], "r1", 2, 1)
            self.hosts.append(host)
            batch.append(host)
        self.run(self._inventories(batch))
        self.count("inventories batched" + (" (pool move)" if move else ""))

    @precondition(lambda self: self.ready)
    @rule(h=st.integers(0, 9))
    def pool_move(self, h: int) -> None:
        self.run(self._pool_move(self.host(h)))

    async def _pool_move(self, host: SimHost) -> None:
        holding = host.node_id in (await self._held_devices())[0]
        host.pool_id = next(p for p in self.pools if p != host.pool_id)
        host.boot += 1
        await self._inventory(host)
        self.count("pool move (holding bookings)" if holding else "pool move")

    # -- bookings ----------------------------------------------------------------------------

    @precondition(lambda self: self.ready)
    @rule(
        shape=st.sampled_from(list(SHAPES)),
        count=st.integers(1, 3),
        tenant=st.integers(0, 1),
        pool=st.integers(0, 1),
        start=st.sampled_from([None, None, None, 10 * MINUTE, 60 * MINUTE, 150 * MINUTE]),
        duration=st.sampled_from(["15m", "1h", "1h", "3h"]),
        spot=st.sampled_from([False, False, False, True]),
        lease=st.sampled_from([None, None, 60, 600]),
        resources=st.sampled_from(RESOURCES),
        wait=st.sampled_from([0] * 7 + [20]),
    )
    def create(
        self,
        shape: str,
        count: int,
        tenant: int,
        pool: int,
        start: int | None,
        duration: str,
        spot: bool,
        lease: int | None,
        resources: dict[str, int] | None,
        wait: int,
    ) -> None:
        tenant_id = self.tenants[tenant]
        pool_id = self.pools[0 if tenant == 1 else pool]  # tenant b sees the offered pool only
        body = create_body(
            tenant_id,
            pool_id,
            f"k{next(self.keys)}",
            shape,
            count,
            start=None if start is None else self.now + start,
            duration=duration,
            spot=spot,
            lease_seconds=lease,
            resources=resources,
            wait_ms=wait,
        )
        self.run(self._create(body, shape))

    @precondition(lambda self: self.ready)
    @rule(
        order=st.tuples(
            st.sampled_from(list(SHAPES)),
            st.integers(1, 2),
            st.integers(0, 1),
            st.sampled_from(["15m", "1h"]),
            st.booleans(),
            st.sampled_from([None, 60]),
        )
    )
    def book(self, order: tuple[str, int, int, str, bool, int | None]) -> None:
        """The common create, drawn as often again (and first: hypothesis favours the
        rules with fewest arguments): now, in the shared pool, no extras."""
        shape, count, tenant, duration, spot, lease = order
        body = create_body(
            self.tenants[tenant],
            self.pools[0],
            f"k{next(self.keys)}",
            shape,
            count,
            start=None,
            duration=duration,
            spot=spot,
            lease_seconds=lease,
            resources=None,
        )
        self.run(self._create(body, shape))

    @precondition(lambda self: self.ready)
    @rule(
        i=st.integers(0, 15),
        count=st.integers(1, 2),
        spot=st.booleans(),
        later=st.sampled_from([None, 30 * MINUTE]),
    )
    def book_device(self, i: int, count: int, spot: bool, later: int | None) -> None:
        """Book forms of one device (a selector pins it), those under bookings first: a
        device that changed form, or was lost and came back, while its bookings run."""
        host, dev = self.device(i, object)
        if isinstance(dev, SimGpu | SimNic):
            self.run(self._book_forms(host, dev, count, spot=spot, later=later))

    async def _book_forms(
        self, host: SimHost, dev: SimGpu | SimNic, count: int, *, spot: bool, later: int | None
    ) -> None:
        entry, forms = host.form(dev)
        body = (
            {
                "tenantId": self.tenants[0],
                "poolId": host.pool_id,
                "duration": "1h",
                "idempotencyKey": f"k{next(self.keys)}",
                "devices": [entry | {"count": min(count, forms)}],
            }
            | ({"spot": True} if spot else {})
            | ({"start": self.now + later} if later else {})
        )
        await self._create(body, f"device {entry['class']}")

    async def _create(self, body: dict[str, Any], shape: str) -> None:
        now = self.now
        try:
            out = await self.reservations.create(create_request(body))
        except Unavailable as exc:
            # One writer, nothing to race: the placer offered what the database refuses.
            raise InvariantViolation(
                f"create {body} answered 503 ({exc}) with no other writer: the placer "
                "offered capacity the database's claims refuse (the same physical device "
                "promised twice)"
            ) from exc
        if isinstance(out, Replayed):
            raise InvariantViolation(f"a fresh key was answered as a replay: {out}")
        if isinstance(out, Refused):
            self.answers.append((body, out.error.status, RESERVATION_ANSWERS.refused(out.error)))
            self.count(f"create refused: {out.error.code}")
            return
        assert isinstance(out, Created)
        res = out.reservation
        self.answers.append((body, 200, reservation(res, out.at)))
        self.models[res.reservation_id] = self._model(res)
        noticed_before = {
            v.reservation_id: self.models[v.reservation_id].preempt_at for v in out.victims
        }
        for victim in out.victims:
            self.models[victim.reservation_id].preempt_at = victim.preempt_at
        self.count(f"create booked: {shape}" + (" (preempting)" if out.victims else ""))
        view = await self.view()
        problems = ref.broken_promises(view, res.reservation_id)
        problems += ref.overcommitted(view, res.reservation_id, now)
        problems += self._unbookable(view, res)
        problems += self._notices(out, now, noticed_before)
        problems += self._born_at_risk(view, res, now)
        self.fail(problems, f"create {body}")

    def _born_at_risk(self, view: LedgerView, res: Reservation, now: int) -> list[str]:
        """A booking is at risk from its first answer when it took faulty devices (whole
        nodes keep theirs); no alert, nothing changed for it."""
        risky, unsaid = ref.at_risk_atoms(view, self.models[res.reservation_id])
        self.at_risk[res.reservation_id] = bool(risky)
        flag = reservation(res, now).get("atRisk")
        got = sorted(flag["atoms"]) if flag else []
        if unsaid or got == sorted(risky):
            return []
        return [f"{res.reservation_id} answered atRisk {flag}, atoms at risk {sorted(risky)}"]

    def _model(self, res: Reservation) -> ref.ReservationModel:
        return ref.ReservationModel(
            reservation_id=res.reservation_id,
            tenant_id=res.tenant_id,
            pool_id=res.pool_id,
            start=res.start,
            end=res.end,
            atoms=tuple(a.atom_id for a in res.atoms),
            lease_seconds=res.lease_seconds,
            lease_expires_at=res.lease_expires_at,
        )

    def _unbookable(self, view: LedgerView, res: Reservation) -> list[str]:
        """A new booking takes current atoms of allocatable nodes of its own pool, healthy
        ones unless it takes whole nodes (those keep their faulty devices)."""
        whole = res.binding == "node" or any(a.cls == "node" for a in res.atoms)
        out = []
        for a in res.atoms:
            atom = view.atoms.get(a.atom_id)
            node = view.nodes.get(a.node_id)
            if atom is None or node is None or atom.retired:
                out.append(f"{res.reservation_id} booked {a.atom_id}, not a current atom")
            elif node.pool_id != res.pool_id:
                out.append(f"{res.reservation_id} booked {a.atom_id} of pool {node.pool_id}")
            elif ref.node_bucket(node) != "allocatable":
                out.append(
                    f"{res.reservation_id} booked {a.atom_id} on a node that is "
                    f"{ref.node_bucket(node)}"
                )
            elif not whole and atom.health in ref.FAULTY:
                out.append(f"{res.reservation_id} booked {a.atom_id}, which is {atom.health}")
        return out

    def _notices(self, out: Created, now: int, before: dict[str, int | None]) -> list[str]:
        """Victims are spot holders, noticed now for now + the notice period (or kept to
        an earlier notice they already had), and the new booking starts after."""
        problems = []
        for victim in out.victims:
            want = before.get(victim.reservation_id) or now + NOTICE_MS
            if victim.preempt_at != want or not victim.spot:
                problems.append(
                    f"victim {victim.reservation_id} noticed for "
                    f"{victim.preempt_at}, spot={victim.spot}"
                )
            if out.reservation.start < now + NOTICE_MS:
                problems.append(
                    f"{out.reservation.reservation_id} preempts and starts at "
                    f"{out.reservation.start}, before the notice runs out"
                )
        noticed = {a.reservation_id for a in self.alerts.alerts if a.kind == "reservation.notice"}
        missing = [v.reservation_id for v in out.victims if v.reservation_id not in noticed]
        if missing:
            problems.append(f"victims {missing} got no reservation.notice")
        return problems

    @precondition(lambda self: self.ready and bool(self.answers))
    @rule(i=st.integers(0, 99))
    def replay_create(self, i: int) -> None:
        body, status, answer = _pick(self.answers, i)
        out = self.run(self.reservations.create(create_request(body)))
        if not isinstance(out, Replayed) or (out.status, out.body) != (status, answer):
            raise InvariantViolation(f"replay of {body} answered {out}, first {status} {answer}")
        self.count("create replayed")

    @precondition(lambda self: self.ready)
    @rule(
        tenant=st.integers(0, 1),
        pool=st.integers(0, 1),
        first=st.integers(0, 10),
        count=st.integers(1, 4),
        gb=st.sampled_from([4, 8, 16, 32, 48, 64]),
    )
    def book_intervals(self, tenant: int, pool: int, first: int, count: int, gb: int) -> None:
        tenant_id = self.tenants[tenant]
        pool_id = self.pools[0 if tenant == 1 else pool]
        body = interval_body(self.now, first, count, gb)
        self.run(self._intervals(tenant_id, body, pool_id))

    async def _intervals(self, tenant_id: str, body: dict[str, Any], pool_id: str) -> None:
        out = await self.intervals.book(tenant_id, body, pool_id, f"i{next(self.keys)}")
        if isinstance(out, IntervalsRefused):
            self.count("intervals refused")
            return
        assert isinstance(out, IntervalsBooked), out
        self.count("intervals booked")
        view = await self.view()
        self.fail(
            ref.overcommitted(view, out.reservation.reservation_id, self.now),
            f"interval booking {body} in {pool_id}",
        )

    @precondition(lambda self: self.ready and bool(self.models))
    @rule(i=st.integers(0, 99), seconds=st.sampled_from([None, 60, 600]))
    def renew(self, i: int, seconds: int | None) -> None:
        # Leased reservations first, live ones before ended ones.
        leased = sorted(
            self.models.values(),
            key=lambda m: (m.lease_seconds is None, not m.live(self.now, self.ticks)),
        )
        m = _pick(leased, i)
        self.run(self._renew(m, seconds))

    async def _renew(self, m: ref.ReservationModel, seconds: int | None) -> None:
        now = self.now
        renewable = m.lease_seconds is not None and m.live(now, self.ticks)
        try:
            out = await self.reservations.renew(m.tenant_id, m.reservation_id, seconds)
        except InvalidInput:
            if renewable:
                raise InvariantViolation(f"renew of live leased {m} refused at {now}") from None
            self.count("renew refused")
            return
        if not renewable:
            raise InvariantViolation(f"renew of {m} answered {out} at {now}")
        m.lease_seconds = seconds or m.lease_seconds
        assert m.lease_seconds is not None
        m.lease_expires_at = now + m.lease_seconds * 1000
        stored = await self.ledger.reservations.get(m.reservation_id, m.tenant_id)
        if (out.reservation.lease_expires_at, stored.lease_expires_at) != (m.lease_expires_at,) * 2:
            raise InvariantViolation(
                f"renew answered lease {out.reservation.lease_expires_at}, stored "
                f"{stored.lease_expires_at}, expected {m.lease_expires_at}"
            )
        self.count("renewed")

    @precondition(lambda self: self.ready and bool(self.models))
    @rule(i=st.integers(0, 99))
    def release(self, i: int) -> None:
        m = _pick(list(self.models.values()), i)
        self.run(self._release(m))

    async def _release(self, m: ref.ReservationModel) -> None:
        now = self.now
        was_live = m.live(now, self.ticks)
        out = await self.reservations.release(m.tenant_id, m.reservation_id)
        state = out.reservation.state(now)
        if was_live:
            m.released_at = now
        if state not in m.states(now, self.ticks):
            raise InvariantViolation(f"release of {m} answered {state!r} at {now}")
        self.count("released" if was_live else "release of an ended reservation")

    # -- time -----------------------------------------------------------------------------------

    @precondition(lambda self: self.ready)
    @rule(
        ms=st.sampled_from(
            # Past a 60 s lease and a 120 s notice first, then short and long moves.
            [61_000, 121_000, 1_000, 30_000, 5 * MINUTE, 15 * MINUTE, 60 * MINUTE, 180 * MINUTE]
        )
    )
    def time_passes(self, ms: int) -> None:
        self.clock.advance(ms)
        self.run(self.res_clock.tick())
        self.ticks.append(self.now)
        self.count("clock advanced")

    # -- after every step --------------------------------------------------------------------

    @invariant()
    def ledger_is_true(self) -> None:
        if self.ready:
            self.run(self._check())

    async def _check(self) -> None:
        now = self.now
        view = await self.view()
        problems = ref.double_bookings(view)
        problems += ref.quota_overruns(view)
        problems += ref.rollup_mismatches(view, self.pools, now)
        problems += ref.moved_bookings(view, now)
        shown: dict[str, Reservation] = {}
        for tenant_id in self.tenants:
            found = ReservationFilter(tenant_id=tenant_id)
            for res in await self.ledger.listing.page(found, None, 1000, now):
                shown[res.reservation_id] = res
        states = {k: r.state(now) for k, r in shown.items()}
        problems += ref.state_mismatches(self.models.values(), states, now, self.ticks)
        problems += ref.holding_mismatches(
            view,
            [
                ref.Holding(
                    m.reservation_id,
                    states.get(m.reservation_id, "?"),
                    m.start,
                    m.held_until(),
                    m.atoms,
                )
                for m in self.models.values()
            ],
            now,
        )
        problems += await self._truth_under_change(view, shown, now)
        self.fail(problems, "the step")

    @precondition(lambda self: self.ready)
    @rule(pool=st.integers(0, 1))
    def rebuild(self, pool: int) -> None:
        """The periodic rebuild (every 10 s in the coordinator) finds nothing to correct
        (it runs as Ledger.rebuild_all does, on this sequence's pools only)."""
        self.run(self._no_drift(self.pools[pool]))

    async def _no_drift(self, pool_id: str) -> None:
        async with self.db.transaction() as conn:
            await lock_pool(conn, pool_id)
            drift = await rebuild_pool(conn, pool_id, self.now)
        self.fail(
            [f"pool {pool_id}: the rebuild corrected {drift} drifted rows"] if drift else [],
            "the periodic rebuild",
        )
        self.count("rebuilt")

    async def _truth_under_change(
        self, view: LedgerView, shown: dict[str, Reservation], now: int
    ) -> list[str]:
        """SPEC §5 at-risk flags and their alerts, pool-change holds, and the outbox: every
        alert announced since the last step is in it (written in the transaction of the
        change it reports), and each reservation's risk change has its alert there."""
        problems = []
        announced = self.alerts.alerts[self.alerts_seen :]
        self.alerts_seen = len(self.alerts.alerts)
        written = await read_outbox(self.db, self.outbox_seen)
        if written:
            self.outbox_seen = written[-1][0]
        ours = set(self.models)
        new_alerts = [a for _, a in written if a.reservation_id in ours]
        in_outbox = {a.alert_id for _, a in written}
        problems += [
            f"alert {a.kind} {a.alert_id} ({a.reservation_id or a.node_id}) was announced "
            "but is not in the outbox"
            for a in announced
            if a.alert_id not in in_outbox and a.alert_id not in self.outbox_ids
        ]
        self.outbox_ids |= in_outbox
        for rid, m in self.models.items():
            res = shown.get(rid)
            if res is None or res.state(now) not in ref.LIVE_STATES:
                self.at_risk.pop(rid, None)
                continue
            flag = reservation(res, now).get("atRisk")
            risky, unsaid = ref.at_risk_atoms(view, m)
            if unsaid:
                self.at_risk[rid] = bool(flag)
                continue
            if bool(flag) != bool(risky):
                problems.append(f"{rid}: atRisk {flag}, atoms at risk {sorted(risky)}")
            elif flag and sorted(flag.get("atoms", sorted(risky))) != sorted(risky):
                problems.append(
                    f"{rid}: atRisk names {flag.get('atoms')}, expected {sorted(risky)}"
                )
            before = self.at_risk.get(rid, False)
            if bool(risky) != before:
                kind = "reservation.atRisk" if risky else "reservation.recovered"
                if not any(a.kind == kind and a.reservation_id == rid for a in new_alerts):
                    problems.append(f"{rid}: no {kind} alert when it changed")
            self.at_risk[rid] = bool(risky)
        for host in self.hosts:
            node = view.nodes.get(host.node_id)
            if node is None or node.pool_id == host.pool_id:
                continue
            if not node.maintenance or "pool change pending" not in node.maintenance_reason:
                problems.append(
                    f"{host.node_id} reported pool {host.pool_id}, still in "
                    f"{node.pool_id} and not 'pool change pending'"
                )
        return problems


def machine_for(glue: Glue, base: type[LedgerMachine] = LedgerMachine) -> type[LedgerMachine]:
    """A machine class bound to one test's loop and ledger."""
    return type(base.__name__, (base,), {"glue": glue})
