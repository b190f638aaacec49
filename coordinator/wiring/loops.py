"""The periodic loops as a resource: the leadership tick (run once before anything
else, so a lone replica leads from the start), the probe and the relay on every replica,
the leader's fenced writes; stopped on the way out."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from coordinator.config import CoordinatorSettings
from coordinator.services.capacity_signal import CapacitySignal
from coordinator.tasks.loops import Loops
from coordinator.tasks.reservation_clock import ReservationClock
from coordinator.tasks.shutdown import bounded
from coordinator.wiring.bus import Wire
from coordinator.wiring.ledger import Store
from coordinator.wiring.node_watch import Watch
from shared.clock import Clock

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Running:
    loops: Loops
    drift_total: list[int] = field(default_factory=lambda: [0])  # rows the rebuild fixed


@asynccontextmanager
async def loops_context(
    settings: CoordinatorSettings, clock: Clock, store: Store, wire: Wire, watch: Watch,
    capacity: CapacitySignal,
) -> AsyncIterator[Running]:  # fmt: skip
    ledger, leadership, nodes, use = store.ledger, store.leadership, watch.nodes, watch.gpu_use
    running = Running(Loops())

    async def lead_tick() -> None:
        await leadership.tick(clock.now_ms())

    def lead() -> bool:
        return leadership.is_leader

    def fenced(body: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
        """A leader loop's body: each ledger transaction in it is a fenced write."""

        async def run() -> None:
            with leadership.fenced():
                await body()

        return run

    async def rebuild() -> None:
        await nodes.hold_duplicates()
        drift = await ledger.rebuild_all(clock.now_ms())
        running.drift_total[0] += drift
        if drift:
            log.warning("rollup rebuild corrected %d drifted rows", drift)

    await lead_tick()
    clock_loop = ReservationClock(ledger, clock, capacity, wire.relay)
    add = running.loops.add
    add("leadership", 1.0, lead_tick)
    add("nats-probe", settings.nats.probe_interval_s, wire.bus.probe)
    add("write-pending", 0.05, fenced(nodes.write_pending), when=lead)
    add("flush-last-seen", settings.flush_interval_s, fenced(nodes.flush_last_seen), when=lead)
    add("sweep", settings.sweep_interval_s, fenced(nodes.sweep), when=lead)
    add("node-bookings", 0.5, watch.bookings.tick, when=lead)
    add("use-requests", 0.25, use.request_reports, when=lead)
    add("use", settings.use_interval_s, fenced(use.tick), when=lead)
    # Another replica's placer needs the GPUs in unbooked use too (reads only).
    add("use-follow", settings.use_interval_s, use.follow, when=lambda: not lead())
    add("rebuild-rollup", settings.rebuild_interval_s, fenced(rebuild), when=lead)
    add("reservation-clock", settings.reservation_tick_s, fenced(clock_loop.tick), when=lead)
    purge = store.idempotency_purge
    add("idempotency-purge", settings.idempotency_purge_interval_s, fenced(purge.tick), when=lead)
    # Every replica runs it; the leader alone drains and counts the backlog (fenced).
    add("alert-outbox", 0, wire.relay.tick)
    running.loops.start()
    try:
        yield running
    finally:
        await bounded("loops", running.loops.stop)()
