"""The node watch as a resource: liveness, what GPUs run, the bookings broadcast and the
ingest that feeds them, loaded from the ledger (with the rollup rebuilt from it) before
the bus delivers a single heartbeat. Nothing to undo: the subscriptions close with the
bus."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from coordinator.bus.ingest import Ingest
from coordinator.config import CoordinatorSettings, load_tenant_rules
from coordinator.domain.gpu_use_units import Policy
from coordinator.domain.liveness import LivenessTracker
from coordinator.domain.rate_limit import RateLimiter
from coordinator.domain.tenant_rules import NO_RULES, TenantRules, unknown_tenants
from coordinator.services.capacity_signal import CapacitySignal
from coordinator.services.gpu_use_watch import GpuUseWatch
from coordinator.services.node_bookings import NodeBookingsBroadcast
from coordinator.services.node_watch import NodeWatch
from coordinator.wiring.bus import Wire
from coordinator.wiring.ledger import Store
from shared.clock import Clock
from shared.subjects import Subjects
from shared.wire import Heartbeat, Inventory, UseReport

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Watch:
    nodes: NodeWatch
    gpu_use: GpuUseWatch
    bookings: NodeBookingsBroadcast
    ingest: Ingest


@dataclass
class WithBookings:
    """The ingest sink: node watch first, then the bookings broadcast's etag check.
    Not frozen: bench/ingest_bench.py wraps `on_heartbeat` to time each heartbeat."""

    nodes: NodeWatch
    bookings: NodeBookingsBroadcast

    def on_heartbeat(self, hb: Heartbeat) -> None:
        self.nodes.on_heartbeat(hb)
        self.bookings.on_heartbeat(hb)

    def on_inventory(self, inv: Inventory) -> None:
        self.nodes.on_inventory(inv)

    def on_use_report(self, report: UseReport) -> None:
        self.nodes.on_use_report(report)


def liveness_tracker(settings: CoordinatorSettings) -> LivenessTracker:
    return LivenessTracker(
        misses=settings.misses,
        recovery_hold_ms=int(settings.recovery_hold_s * 1000),
        min_interval_ms=int(settings.min_interval_s * 1000),
        max_interval_ms=int(settings.max_interval_s * 1000),
        outage_fraction=settings.outage_fraction,
        outage_min_nodes=settings.outage_min_nodes,
    )


async def tenant_rules(settings: CoordinatorSettings, store: Store) -> TenantRules:
    """The operator's tenant mapping rules (settings checked them already); a rule naming
    a tenant the ledger does not have yet is warned about, file and line."""
    path = settings.tenant_rules
    if path is None:
        return NO_RULES
    rules = load_tenant_rules(path)
    known = {t.tenant_id for t in await store.ledger.tenants.list()}
    for line in unknown_tenants(rules, path, known):
        log.warning("tenant_rules: %s", line)
    return rules


@asynccontextmanager
async def node_watch_context(
    settings: CoordinatorSettings, clock: Clock, subjects: Subjects, store: Store, wire: Wire,
    tracker: LivenessTracker, capacity: CapacitySignal,
) -> AsyncIterator[Watch]:  # fmt: skip
    ledger, bus = store.ledger, wire.bus
    use_ms = int(settings.use_interval_s * 1000)
    use = GpuUseWatch(
        ledger, subjects, clock, bus, wire.relay, lambda node_id: _reachable(tracker, node_id),
        Policy(int(settings.idle_after_s * 1000), settings.idle_util_percent),
        # Use older than a few passes (or a minute) is no longer what runs.
        stale_ms=max(4 * use_ms, 60_000), max_gap_ms=max(4 * use_ms, 60_000),
        flush_ms=int(settings.use_flush_s * 1000), term=lambda: store.leadership.epoch,
        rules=await tenant_rules(settings, store),
    )  # fmt: skip
    # The node watch and ingest refer to each other only through the drop counter.
    ingest_ref: list[Ingest] = []
    nodes = NodeWatch(
        ledger, tracker, subjects, clock, bus, wire.relay,
        drop=lambda reason, subject: ingest_ref[0].drop(reason, subject),
        capacity=capacity, is_leader=lambda: store.leadership.is_leader,
        backlog=bus.backlog, backlog_limit=settings.ingest_backlog_limit, use=use,
    )  # fmt: skip
    limiter = RateLimiter(settings.ingest_node_rate, settings.ingest_node_burst)
    bookings = NodeBookingsBroadcast(ledger, subjects, clock, bus)
    ingest = Ingest(subjects, WithBookings(nodes, bookings), limiter)
    ingest_ref.append(ingest)
    await nodes.load()
    await use.load()
    # Serve only a rollup rebuilt from the ledger: after a crash it is the truth. Nodes
    # no change has judged (a ledger upgraded with two ids of one host) are held first.
    await nodes.hold_duplicates()
    drift = await ledger.rebuild_all(clock.now_ms())
    if drift:
        log.warning("startup rebuild corrected %d rollup rows", drift)
    # Every replica sees every heartbeat (no queue group), so a follower's tracker is
    # warm when it takes over; only the leader writes what the heartbeats imply.
    for subject in (subjects.all_heartbeats, subjects.all_inventories, subjects.all_use):
        await bus.subscribe_batched(subject, ingest.on_message)
    yield Watch(nodes, use, bookings, ingest)


def _reachable(tracker: LivenessTracker, node_id: str) -> bool:
    node = tracker.nodes.get(node_id)
    return node is not None and node.reachable
