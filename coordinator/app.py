"""Wiring: builds every part of the coordinator from one settings object and runs them
under one exit stack, so shutdown undoes startup in reverse order (aiohttp's
cleanup-context idea, applied to the whole process).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass

from coordinator.api.alert_feed import AlertFeed
from coordinator.api.context import Services
from coordinator.api.server import HttpLimits, HttpServer, build_app, metrics_app
from coordinator.bus.alerts import AlertStream, feed_from_bus
from coordinator.bus.connection import Bus
from coordinator.bus.ingest import Ingest
from coordinator.config import CoordinatorSettings
from coordinator.domain.liveness import LivenessTracker
from coordinator.domain.rate_limit import RateLimiter
from coordinator.domain.use_join import Policy
from coordinator.ledger import Leadership, Ledger
from coordinator.runtime.metrics import Metrics, Sources
from coordinator.services.capacity_signal import CapacitySignal
from coordinator.services.node_bookings import NodeBookingsBroadcast
from coordinator.services.node_watch import NodeWatch
from coordinator.services.use_watch import UseWatch
from coordinator.tasks.idempotency_purge import IdempotencyPurge
from coordinator.tasks.loops import Loops
from coordinator.tasks.outbox_relay import OutboxRelay
from coordinator.tasks.reservation_clock import ReservationClock
from coordinator.tasks.shutdown import bounded
from procs.nats import tls_context
from procs.settings import ConfigError
from shared.clock import Clock, SystemClock
from shared.subjects import Subjects
from shared.wire import Heartbeat, Inventory, UseReport

log = logging.getLogger(__name__)

OPERATOR_TENANT = "operator"


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
    use: UseWatch | None = None

    @property
    def url(self) -> str:
        return f"http://{self.settings.http_host}:{self.http.port}"


def check_bus_security(bus: Bus, settings: CoordinatorSettings) -> None:
    """Refuse an open bus: on a NATS server without authentication anyone who can reach
    it can forge any node's heartbeats and inventories."""
    if bus.auth_required:
        if not bus.tls and not _loopback(settings.nats_url):
            log.warning(
                "NATS at %s is not on this host and not TLS: passwords cross the network in clear",
                settings.nats_url,
            )
        return
    if settings.insecure_bus:
        log.warning(
            "NATS at %s requires no credentials (insecure_bus is set): anyone who can"
            " reach it can forge heartbeats and inventories",
            settings.nats_url,
        )
        return
    raise ConfigError(
        "nats_url",
        f"NATS at {settings.nats_url} lets anyone connect without credentials, so anyone"
        " could forge node heartbeats and inventories: run it with per-agent credentials"
        " (`gpufleet nats-auth`) and give `nats_credentials`, or pass `--insecure-bus`",
    )


def _loopback(url: str) -> bool:
    hosts = [u.split("://", 1)[-1].rsplit("@", 1)[-1].rsplit(":", 1)[0] for u in url.split(",")]
    return all(h in ("127.0.0.1", "localhost", "[::1]", "::1") for h in hosts)


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


async def bootstrap_operator(ledger: Ledger, key: str, now: int) -> None:
    await ledger.tenants.ensure(OPERATOR_TENANT, "platform operator", now)
    try:
        await ledger.keys.ensure(key, OPERATOR_TENANT, frozenset({"operator"}), "bootstrap", now)
    except ValueError as exc:
        raise ConfigError("bootstrap_operator_key", str(exc)) from None


@asynccontextmanager
async def running_coordinator(
    settings: CoordinatorSettings,
    clock: Clock | None = None,
) -> AsyncIterator[Coordinator]:
    clock = clock or SystemClock()
    subjects = Subjects(settings.subject_prefix)
    # Names this replica in pg_stat_activity and in the leader term.
    replica = f"{socket.gethostname()}/{os.getpid()}/{secrets.token_hex(3)}"
    async with AsyncExitStack() as stack:
        ledger = await Ledger.open(
            settings.effective_database_url, application_name=f"gpufleet-coordinator {replica}"
        )
        stack.push_async_callback(bounded("ledger", ledger.close))
        # Built first: a retention below the SPEC's 24 h is refused before anything runs.
        idempotency_purge = IdempotencyPurge(ledger, clock, int(settings.idempotency_keep_s * 1000))
        if settings.bootstrap_operator_key:
            await bootstrap_operator(ledger, settings.bootstrap_operator_key, clock.now_ms())

        tracker = LivenessTracker(
            misses=settings.misses,
            recovery_hold_ms=int(settings.recovery_hold_s * 1000),
            min_interval_ms=int(settings.min_interval_s * 1000),
            max_interval_ms=int(settings.max_interval_s * 1000),
            outage_fraction=settings.outage_fraction,
            outage_min_nodes=settings.outage_min_nodes,
        )
        behind_hook: list[NodeWatch] = []
        bus = Bus(
            settings.nats_url,
            on_up=lambda: tracker.bus_up(clock.now_ms()),
            on_down=tracker.bus_down,
            on_behind=lambda: behind_hook[0].fell_behind() if behind_hook else None,
            user_credentials=settings.nats_credentials,
            tls=tls_context(settings.nats_tls_ca, settings.nats_tls_cert, settings.nats_tls_key),
            probe_timeout_s=settings.nats_probe_timeout_s,
            pending_msgs_limit=settings.nats_pending_msgs_limit,
        )
        stream = AlertStream(
            bus,
            subjects,
            max_msgs=settings.alert_stream_max_msgs,
            max_age_s=settings.alert_stream_max_age_s,
            replicas=settings.alert_stream_replicas,
            publish_timeout_s=settings.alert_publish_timeout_s,
        )
        capacity = CapacitySignal()
        leadership = ledger.leadership(holder=replica)
        # The services' alert sink: alerts are committed to the outbox with their
        # transitions; announcing one only wakes the relay that publishes them.
        alerts = OutboxRelay(
            ledger, stream, clock, leadership, interval_s=settings.outbox_interval_s
        )
        stack.push_async_callback(bounded("leadership", leadership.close))
        # The service and ingest refer to each other only through the drop counter.
        ingest_ref: list[Ingest] = []

        def reachable(node_id: str) -> bool:
            node = tracker.nodes.get(node_id)
            return node is not None and node.reachable

        use_ms = int(settings.use_interval_s * 1000)
        use = UseWatch(
            ledger, subjects, clock, bus, alerts, reachable,
            Policy(int(settings.idle_after_s * 1000), settings.idle_util_percent),
            # Use older than a few passes (or a minute) is no longer what runs.
            stale_ms=max(4 * use_ms, 60_000),
            max_gap_ms=max(4 * use_ms, 60_000),
            flush_ms=int(settings.use_flush_s * 1000),
        )  # fmt: skip
        nodes = NodeWatch(
            ledger,
            tracker,
            subjects,
            clock,
            bus,
            alerts,
            drop=lambda reason, subject: ingest_ref[0].drop(reason, subject),
            capacity=capacity,
            is_leader=lambda: leadership.is_leader,
            backlog=bus.backlog,
            backlog_limit=settings.ingest_backlog_limit,
            use=use,
        )
        behind_hook.append(nodes)
        limiter = RateLimiter(settings.ingest_node_rate, settings.ingest_node_burst)
        bookings = NodeBookingsBroadcast(ledger, subjects, clock, bus)
        ingest = Ingest(subjects, WithBookings(nodes, bookings), limiter)
        ingest_ref.append(ingest)
        await nodes.load()
        # Serve only a rollup rebuilt from the ledger: after a crash it is the truth.
        drift = await ledger.rebuild_all(clock.now_ms())
        if drift:
            log.warning("startup rebuild corrected %d rollup rows", drift)

        await bus.connect()
        stack.push_async_callback(bounded("bus", bus.close))
        check_bus_security(bus, settings)
        try:
            await asyncio.wait_for(stream.setup(), timeout=10)
        except Exception as exc:
            # JetStream may be electing or away; the relay sets it up before publishing.
            log.warning("alert stream %s not set up yet: %s", stream.name, exc)
        # Every replica sees every heartbeat (no queue group), so a follower's tracker is
        # warm when it takes over; only the leader writes what the heartbeats imply.
        await bus.subscribe_batched(subjects.all_heartbeats, ingest.on_message)
        await bus.subscribe_batched(subjects.all_inventories, ingest.on_message)
        await bus.subscribe_batched(subjects.all_use, ingest.on_message)
        feed = AlertFeed()
        await bus.subscribe(subjects.all_alerts, feed_from_bus(feed.add))

        async def lead_tick() -> None:
            await leadership.tick(clock.now_ms())

        await lead_tick()

        def lead() -> bool:
            return leadership.is_leader

        def fenced(body: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
            """A leader loop's body: each ledger transaction in it is a fenced write."""

            async def run() -> None:
                with leadership.fenced():
                    await body()

            return run

        loops = Loops()
        loops.add("leadership", 1.0, lead_tick)
        loops.add("nats-probe", settings.nats_probe_interval_s, bus.probe)
        loops.add("write-pending", 0.05, fenced(nodes.write_pending), when=lead)
        loops.add(
            "flush-last-seen", settings.flush_interval_s, fenced(nodes.flush_last_seen), when=lead
        )
        loops.add("sweep", settings.sweep_interval_s, fenced(nodes.sweep), when=lead)
        loops.add("node-bookings", 0.5, bookings.tick, when=lead)
        loops.add("use-requests", 0.25, use.request_reports, when=lead)
        loops.add("use", settings.use_interval_s, fenced(use.tick), when=lead)

        drift_total = [0]

        async def rebuild() -> None:
            drift = await ledger.rebuild_all(clock.now_ms())
            drift_total[0] += drift
            if drift:
                log.warning("rollup rebuild corrected %d drifted rows", drift)

        loops.add("rebuild-rollup", settings.rebuild_interval_s, fenced(rebuild), when=lead)
        reservation_clock = ReservationClock(ledger, clock, capacity, alerts)
        loops.add(
            "reservation-clock",
            settings.reservation_tick_s,
            fenced(reservation_clock.tick),
            when=lead,
        )
        loops.add(
            "idempotency-purge",
            settings.idempotency_purge_interval_s,
            fenced(idempotency_purge.tick),
            when=lead,
        )
        # Every replica runs it; the leader alone drains and counts the backlog (fenced).
        loops.add("alert-outbox", 0, alerts.tick)
        loops.start()
        stack.push_async_callback(bounded("loops", loops.stop))

        metrics = Metrics(
            Sources(
                accepted=ingest.accepted,
                dropped=ingest.dropped,
                heartbeat_ages_s=lambda: tracker.ages_s(clock.now_ms()),
                agent_bus_errors=tracker.bus_errors,
                drift_corrections=lambda: drift_total[0],
                alerts_published=stream.published_by_kind,
                loop_failures=loops.failures,
                nats_errors=bus.errors,
                nats_probe_failures=lambda: bus.probe_failures,
                bus_connected=lambda: tracker.bus_connected,
                is_leader=lambda: leadership.is_leader,
                outage_holds=lambda: nodes.outage_holds,
                interval_clamped=lambda: nodes.interval_clamped,
                outbox_backlog=lambda: alerts.backlog.unsent,
                outbox_oldest_age_s=alerts.oldest_age_s,
                alert_publish_failures=lambda: alerts.failures,
                fenced_refusals=lambda: leadership.fenced_refusals,
                gpu_use=lambda: use.lines,
            )
        )
        services = Services(
            ledger,
            clock,
            alerts,
            capacity,
            notice_ms=int(settings.notice_s * 1000),
            metrics=metrics,
            feed=feed,
            use=use.book,
        )
        limits = HttpLimits(
            idle_timeout_s=settings.http_idle_timeout_s,
            body_timeout_s=settings.http_body_timeout_s,
            metrics_token=settings.metrics_token,
            metrics_on_api=settings.metrics_port is None,
        )
        http = HttpServer(
            build_app(services, limits=limits),
            settings.http_host,
            settings.http_port,
            idle_timeout_s=settings.http_idle_timeout_s,
        )
        await http.start()
        stack.push_async_callback(bounded("http", http.stop))
        log.info("coordinator API on http://%s:%d", settings.http_host, http.port)
        metrics_http = None
        if settings.metrics_port is not None:
            metrics_http = HttpServer(
                metrics_app(services, limits),
                settings.metrics_host,
                settings.metrics_port,
                idle_timeout_s=settings.http_idle_timeout_s,
            )
            await metrics_http.start()
            stack.push_async_callback(bounded("metrics-http", metrics_http.stop))
            log.info("metrics on http://%s:%d/metrics", settings.metrics_host, metrics_http.port)
        yield Coordinator(
            settings, ledger, bus, ingest, nodes, tracker, http, loops, leadership, alerts,
            stream, replica, metrics_http, bookings, use,
        )  # fmt: skip
