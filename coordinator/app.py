"""Wiring: the coordinator from one settings object, as one async context per resource
(`coordinator/wiring/`: ledger, bus, node watch, loops, HTTP) entered in order on one
exit stack, so shutdown undoes startup in reverse order (aiohttp's cleanup contexts,
applied to the whole process).
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass

from coordinator.api.http.server import HttpServer
from coordinator.bus.alerts import AlertStream
from coordinator.bus.connection import Bus
from coordinator.bus.ingest import Ingest
from coordinator.config import CoordinatorSettings
from coordinator.domain.liveness import LivenessTracker
from coordinator.ledger import Leadership, Ledger
from coordinator.services.capacity_signal import CapacitySignal
from coordinator.services.gpu_use_watch import GpuUseWatch
from coordinator.services.node_bookings import NodeBookingsBroadcast
from coordinator.services.node_watch import NodeWatch
from coordinator.tasks.loops import Loops
from coordinator.tasks.outbox_relay import OutboxRelay
from coordinator.wiring.bus import bus_context
from coordinator.wiring.http import http_context, metrics_of
from coordinator.wiring.ledger import ledger_context
from coordinator.wiring.loops import loops_context
from coordinator.wiring.node_watch import Watch, liveness_tracker, node_watch_context
from shared.clock import Clock, SystemClock
from shared.subjects import Subjects


@dataclass
class Coordinator:
    settings: CoordinatorSettings
    ledger: Ledger
    bus: Bus
    ingest: Ingest
    nodes: NodeWatch
    tracker: LivenessTracker
    http: HttpServer
    loops: Loops
    leadership: Leadership
    relay: OutboxRelay
    stream: AlertStream
    replica: str
    metrics_http: HttpServer | None = None
    bookings: NodeBookingsBroadcast | None = None
    gpu_use: GpuUseWatch | None = None

    @property
    def url(self) -> str:
        return f"http://{self.settings.http_host}:{self.http.port}"


@asynccontextmanager
async def running_coordinator(
    settings: CoordinatorSettings,
    clock: Clock | None = None,
) -> AsyncIterator[Coordinator]:
    clock = clock or SystemClock()
    subjects = Subjects(settings.nats.subject_prefix)
    # Names this replica in pg_stat_activity and in the leader term.
    replica = f"{socket.gethostname()}/{os.getpid()}/{secrets.token_hex(3)}"
    tracker = liveness_tracker(settings)
    capacity = CapacitySignal()
    # The bus is up before the node watch exists; a backlog before then has no one to tell.
    watching: list[Watch] = []

    def on_behind(subject: str) -> None:
        if watching:
            watching[0].nodes.fell_behind()
            watching[0].ingest.lost(subject)

    async with AsyncExitStack() as stack:
        enter = stack.enter_async_context
        store = await enter(ledger_context(settings, clock, replica))
        wire = await enter(bus_context(settings, clock, subjects, store, tracker, on_behind))
        watch = await enter(
            node_watch_context(settings, clock, subjects, store, wire, tracker, capacity)
        )
        watching.append(watch)
        running = await enter(loops_context(settings, clock, store, wire, watch, capacity))
        metrics = metrics_of(clock, store, wire, watch, tracker, running)
        served = await enter(http_context(settings, clock, store, wire, watch, capacity, metrics))
        yield Coordinator(
            settings, store.ledger, wire.bus, watch.ingest, watch.nodes, tracker, served.http,
            running.loops, store.leadership, wire.relay, wire.stream, replica,
            served.metrics_http, watch.bookings, watch.gpu_use,
        )  # fmt: skip
