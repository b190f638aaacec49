"""The concurrent variant of the simulation (PostgreSQL): several writers — asyncio tasks
on their own connections — and two coordinator replicas (two `Ledger`s on one database,
each with its own snapshot cache) against the same pools, each writer a fixed number of
operations (a bound in steps, not seconds: a slow machine runs as many, only slower),
while the fleet changes health, maintenance and reachability and the clock runs and
ticks; then the reference model's invariants over what they left. What each writer
sends comes from the seed; how the writers interleave is the machine's.

Writers share a few idempotency keys (same key, same body), so concurrent duplicates
are part of the load: each key must name one reservation, however many writers sent it.
Device forms do not change here (the sequential machine covers that), so every pair of
overlapping bookings can be judged by the claim rule at the end.
"""

from __future__ import annotations

import asyncio
import random
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.exc import IntegrityError

from coordinator.api.http.render import INTERVAL_ANSWERS, RESERVATION_ANSWERS
from coordinator.domain.errors import InvalidInput, Unavailable
from coordinator.domain.model import Quota
from coordinator.ledger import Database, Ledger, ReservationFilter, WriteRaced
from coordinator.ledger.database import lock_pool
from coordinator.ledger.quotas import QuotaLockMissed
from coordinator.ledger.rollups import rebuild_pool
from coordinator.services.capacity_signal import CapacitySignal
from coordinator.services.idempotent import Replayed
from coordinator.services.intervals import IntervalBookings, IntervalsBooked
from coordinator.services.maintenance import Maintenance
from coordinator.services.node_records import (
    record_heartbeat,
    record_inventory,
    record_reachability,
)
from coordinator.services.reservations import Created, Reservations
from coordinator.tasks.reservation_clock import ReservationClock
from shared.clock import FakeClock
from shared.ids import new_pool_id
from tests.fakes import RecordingAlerts
from tests.simulation import reference as ref
from tests.simulation.fleet import SimGpu, SimHost, SimNic
from tests.simulation.ledger_view import read_view
from tests.simulation.machine import NOTICE_MS
from tests.simulation.requests import RESOURCES, SHAPES, create_body, create_request, interval_body

MINUTE = 60_000


class Replica:
    """One coordinator's write side: its own ledger (and snapshot cache) and services."""

    def __init__(self, ledger: Ledger, clock: FakeClock, alerts: RecordingAlerts) -> None:
        self.ledger = ledger
        capacity = CapacitySignal()
        self.reservations = Reservations(
            ledger, clock, alerts, capacity, RESERVATION_ANSWERS, NOTICE_MS
        )
        self.intervals = IntervalBookings(ledger, clock, capacity, INTERVAL_ANSWERS)
        self.maintenance = Maintenance(ledger, clock, alerts, capacity)
        self.clock = ReservationClock(ledger, clock, capacity, alerts)


@dataclass
class Outcome:
    """What a concurrent run did and what the checker found."""

    seed: int
    operations: Counter[str] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    drift: int = 0


@dataclass
class _Shared:
    rng_seed: int
    clock: FakeClock
    replicas: tuple[Replica, Replica]
    tenants: tuple[str, str]
    pools: tuple[str, str]
    hosts: list[SimHost]
    outcome: Outcome
    stop: asyncio.Event
    # reservationId → (tenant, answered renew leases)
    reservations: dict[str, tuple[str, list[int]]] = field(default_factory=dict)
    released: set[str] = field(default_factory=set)
    keys: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))

    def count(self, what: str) -> None:
        self.outcome.operations[what] += 1


async def _setup(
    ledger: Ledger, clock: FakeClock, ns: str
) -> tuple[tuple[str, str], tuple[str, str], list[SimHost]]:
    now = clock.now_ms()
    tenants = (f"{ns}a", f"{ns}b")
    pools = (new_pool_id(), new_pool_id())
    for t in tenants:
        await ledger.tenants.create(t, t, now)
    for p in pools:
        await ledger.pools.create(p, "sim", tenants[0], None, now)
    await ledger.pools.offer(pools[0], tenants[1], now)
    await ledger.quotas.set(Quota(tenants[0], None, "gpu", 8), now)
    await ledger.quotas.set(Quota(tenants[0], None, "memoryGiB", 160), now)
    await ledger.quotas.set(Quota(tenants[1], pools[0], "memoryGiB", 64), now)
    hosts = []
    for i in range(4):
        host = SimHost.build(f"{ns}-n{i}", pools[i // 2], f"r{i % 2}", 3, 1)
        host.gpus[-1].mode, host.gpus[-1].parts = ("mig", 2) if i % 2 else ("slot", 3)
        host.nics[0].vfs = 2
        await record_inventory(ledger, host.inventory(now), now)
        hosts.append(host)
    return tenants, pools, hosts


async def _writer(sh: _Shared, k: int, operations: int) -> None:
    rng = random.Random(sh.rng_seed * 100 + k)
    for _ in range(operations):
        replica = sh.replicas[rng.randrange(2)]
        roll = rng.random()
        try:
            if roll < 0.55:
                await _create(sh, replica, rng)
            elif roll < 0.7:
                await _intervals(sh, replica, rng)
            elif roll < 0.85:
                await _renew(sh, replica, rng)
            else:
                await _release(sh, replica, rng)
        except Unavailable as exc:
            why = retryable(exc)
            if why is None:
                sh.outcome.violations.append(f"an unexplained 503: {_chain(exc)}")
            sh.count(f"503 {why or 'unexplained'}")
        await asyncio.sleep(0)


def _causes(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and seen not in out:
        out.append(seen)
        seen = seen.__cause__ or seen.__context__
    return out


def _chain(exc: BaseException) -> str:
    return " <- ".join(f"{type(e).__name__}: {e}"[:300] for e in _causes(exc))


def retryable(exc: Unavailable) -> str | None:
    """Why a 503 is one a writer among others may get (issue 31), or None: a write that
    lost every try to another writer — on a tenant's quota lock, or on an idempotency
    key another writer recorded first. Any other 503 — a claim or booking constraint
    refusing what the placer offered (a device promised twice), the database away, a
    replica fenced — says something is wrong."""
    if not isinstance(exc, WriteRaced):
        return None
    causes = _causes(exc)[1:]
    if any(isinstance(c, QuotaLockMissed) for c in causes):
        return "quota lock raced"
    text = " ".join(str(c) for c in causes if isinstance(c, IntegrityError))
    if "idempotency" in text and not re.search(r"device_claims|bookings_no_overlap", text):
        return "idempotency key raced"
    return None


async def _create(sh: _Shared, replica: Replica, rng: random.Random) -> None:
    shared = rng.random() < 0.3
    # A shared key always carries the same body, whoever sends it.
    pick = random.Random(rng.randrange(6)) if shared else rng
    key = f"shared-{pick.random():.6f}" if shared else f"k{rng.random():.12f}"
    tenant = pick.randrange(2)
    shape = pick.choice([s for s in SHAPES if not s.startswith("gang")] + ["gang"])
    body = create_body(
        sh.tenants[tenant],
        sh.pools[0 if tenant else pick.randrange(2)],
        key,
        shape,
        pick.randint(1, 2),
        start=None,
        duration=pick.choice(["15m", "1h"]),
        spot=pick.random() < 0.25,
        lease_seconds=pick.choice([None, 60, 600]),
        resources=pick.choice(RESOURCES),
    )
    if not shared and rng.random() < 0.3:
        body["start"] = sh.clock.now_ms() + rng.choice([10, 60]) * MINUTE
    try:
        out = await replica.reservations.create(create_request(body))
    except InvalidInput:
        # The clock runs beside the writers (up to 10 minutes a step): on a slow machine
        # a start chosen 10 minutes ahead may be past by the time the batch decides.
        if "start" not in body:
            raise
        sh.count("create refused: start past")
        return
    if isinstance(out, Created):
        rid = out.reservation.reservation_id
        sh.reservations[rid] = (out.reservation.tenant_id, [])
        sh.keys[key].add(rid)
        sh.count("create booked")
    elif isinstance(out, Replayed):
        if out.status == 200:
            sh.keys[key].add(out.body["reservationId"])
        sh.count("create replayed")
    else:
        sh.count(f"create refused: {out.error.code}")


async def _intervals(sh: _Shared, replica: Replica, rng: random.Random) -> None:
    tenant = rng.randrange(2)
    pool = sh.pools[0 if tenant else rng.randrange(2)]
    body = interval_body(
        sh.clock.now_ms(), rng.randrange(8), rng.randint(1, 3), rng.choice([8, 16, 32])
    )
    out = await replica.intervals.book(sh.tenants[tenant], body, pool, None)
    sh.count("intervals booked" if isinstance(out, IntervalsBooked) else "intervals refused")


async def _renew(sh: _Shared, replica: Replica, rng: random.Random) -> None:
    if not sh.reservations:
        return
    # The newest ones: those still live, whose leases race the clock.
    rid = rng.choice(list(sh.reservations)[-6:])
    tenant, leases = sh.reservations[rid]
    try:
        out = await replica.reservations.renew(tenant, rid, rng.choice([None, 60, 300]))
    except InvalidInput:
        sh.count("renew refused")
        return
    assert out.reservation.lease_expires_at is not None
    leases.append(out.reservation.lease_expires_at)
    sh.count("renewed")


async def _release(sh: _Shared, replica: Replica, rng: random.Random) -> None:
    if not sh.reservations:
        return
    rid = rng.choice(list(sh.reservations))  # in booking order: the ids are random
    out = await replica.reservations.release(sh.reservations[rid][0], rid)
    if out.reservation.stored_state == "released" and out.reservation.ended_at == out.at:
        sh.released.add(rid)
    sh.count("released")


async def _fleet(sh: _Shared) -> None:
    rng = random.Random(sh.rng_seed * 100 + 99)
    while not sh.stop.is_set():
        replica = sh.replicas[rng.randrange(2)]
        host = rng.choice(sh.hosts)
        now = sh.clock.now_ms()
        roll = rng.random()
        if roll < 0.3:
            await record_reachability(replica.ledger, [host.node_id], rng.random() < 0.6, now)
        elif roll < 0.55:
            await replica.maintenance.set(host.node_id, rng.random() < 0.4, "sim", "op/sim")
        elif roll < 0.8:
            devices: list[SimGpu | SimNic] = [*host.gpus, *host.nics]
            dev = rng.choice(devices)
            dev.health = rng.choice(["healthy", "healthy", "unhealthy"])
            await record_heartbeat(replica.ledger, host.heartbeat(now), now)
        else:
            host.health = rng.choice(["healthy", "healthy", "degraded", "unhealthy"])
            await record_heartbeat(replica.ledger, host.heartbeat(now), now)
        sh.count("fleet change")
        await asyncio.sleep(0.02)


async def _time(sh: _Shared, ticks: list[int]) -> None:
    rng = random.Random(sh.rng_seed * 100 + 98)
    while not sh.stop.is_set():
        await asyncio.sleep(0.03)
        sh.clock.advance(rng.choice([1_000, 30_000, 2 * MINUTE, 10 * MINUTE]))
        await sh.replicas[0].clock.tick()  # the leader runs the reservation clock
        ticks.append(sh.clock.now_ms())
        sh.count("tick")


async def run_concurrently(
    url: str, *, operations: int, writers: int, seed: int, ns: str = "con"
) -> Outcome:
    """Run the load — `writers` writers of `operations` operations each, the fleet and
    the clock moving until they are done — against a migrated database at `url` and
    check what it left."""
    outcome = Outcome(seed)
    clock = FakeClock()
    alerts = RecordingAlerts()
    a, b = await Ledger.open(url), await Ledger.open(url)
    db = Database(url)
    try:
        tenants, pools, hosts = await _setup(a, clock, f"{ns}{seed}")
        sh = _Shared(
            seed,
            clock,
            (Replica(a, clock, alerts), Replica(b, clock, alerts)),
            tenants,
            pools,
            hosts,
            outcome,
            asyncio.Event(),
        )
        ticks: list[int] = []
        async with asyncio.TaskGroup() as tg:
            tg.create_task(_fleet(sh), name="fleet")
            tg.create_task(_time(sh, ticks), name="clock")
            await asyncio.gather(*(_writer(sh, k, operations) for k in range(writers)))
            sh.stop.set()
        await sh.replicas[0].clock.tick()
        outcome.violations, outcome.drift = await check(sh, db)
    finally:
        await db.dispose()
        await b.close()
        await a.close()
    return outcome


async def check(sh: _Shared, db: Database) -> tuple[list[str], int]:
    now = sh.clock.now_ms()
    view = await read_view(db, sh.tenants, sh.pools)
    problems = ref.double_bookings(view) + ref.quota_overruns(view) + ref.moved_bookings(view, now)
    for rid in sh.reservations:
        problems += ref.broken_promises(view, rid)
    problems += _node_overcommit(view)
    shown = {}
    for tenant in sh.tenants:
        found = ReservationFilter(tenant_id=tenant)
        for res in await sh.replicas[1].ledger.listing.page(found, None, 10_000, now):
            shown[res.reservation_id] = res
    holdings = []
    for rid, (_, leases) in sh.reservations.items():
        res = shown[rid]
        state = res.state(now)
        until = min(res.end, res.preempt_at) if res.preempt_at is not None else res.end
        holdings.append(
            ref.Holding(rid, state, res.start, until, tuple(x.atom_id for x in res.atoms))
        )
        if rid in sh.released and state != "released":
            problems.append(f"{rid} was answered 'released', shows {state!r}")
        # A renew that answered "extended" holds: the stored lease is the one the last
        # renew answered (renews may shorten it too, so not the longest), and the clock
        # ended it only once that lease had run out.
        lease = res.lease_expires_at
        if leases and lease not in leases:
            problems.append(f"{rid} stores lease {lease}, no renew answered it: {leases}")
        if res.stored_state == "expired" and (lease is None or (res.ended_at or 0) < lease):
            problems.append(f"{rid} expired at {res.ended_at} with its lease until {lease}")
    problems += ref.holding_mismatches(view, holdings, now)
    for key, ids in sh.keys.items():
        if len(ids) > 1:
            problems.append(f"idempotency key {key} booked {len(ids)} reservations: {sorted(ids)}")
    # Bookings and ticks raced with a moving clock, so a row may be right as of when it
    # was written but not as of now; the rebuild puts it right (drift is reported), and
    # then the rows must equal the reference.
    drift = 0
    for pool_id in sh.pools:
        async with db.transaction() as conn:
            await lock_pool(conn, pool_id)
            drift += await rebuild_pool(conn, pool_id, now)
    view = await read_view(db, sh.tenants, sh.pools)
    problems += ref.rollup_mismatches(view, sh.pools, now)
    return problems, drift


def _node_overcommit(view: Any) -> list[str]:
    """No node's scalars promised beyond its capacity at any instant, no pool's memory
    beyond all its nodes' memory (health moved under the writers, so the allocatable
    part at booking time is not known afterwards)."""
    out = []
    by_node: dict[tuple[str, str], list[tuple[int, int, int]]] = defaultdict(list)
    by_pool: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    for s in view.scalars:
        if s.node_id:
            by_node[(s.node_id, s.resource)].append((s.start, s.end, s.amount))
        if s.resource == "memoryGiB":
            by_pool[s.pool_id].append((s.start, s.end, s.amount))
    for (node_id, resource), items in by_node.items():
        node = view.nodes.get(node_id)
        capacity = node.scalars.get(resource, 0) if node is not None else 0
        if ref.peak(items) > capacity:
            out.append(f"node {node_id} {resource}: {ref.peak(items)} promised of {capacity}")
    for pool_id, items in by_pool.items():
        capacity = sum(n.scalars["memoryGiB"] for n in view.nodes.values() if n.pool_id == pool_id)
        if ref.peak(items) > capacity:
            out.append(f"pool {pool_id} memoryGiB: {ref.peak(items)} promised of {capacity}")
    return out
