"""The HTTP side as a resource: the metrics over every other part, the services the API
calls, the API server and (on its own port, when configured) the metrics server. On the
way out the servers stop first, then the create batches their requests joined commit."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass

from coordinator.api.app import build_app
from coordinator.api.http.context import Services
from coordinator.api.http.server import HttpLimits, HttpServer, metrics_app
from coordinator.config import CoordinatorSettings, load_rate_card
from coordinator.domain.liveness import LivenessTracker
from coordinator.domain.rate_card import RateCardError, check_models
from coordinator.runtime.metrics import Metrics, Sources
from coordinator.services.capacity_signal import CapacitySignal
from coordinator.tasks.shutdown import bounded
from coordinator.wiring.bus import Wire
from coordinator.wiring.ledger import Store
from coordinator.wiring.loops import Running
from coordinator.wiring.node_watch import Watch
from procs.settings import ConfigError
from shared.clock import Clock

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Served:
    http: HttpServer
    metrics_http: HttpServer | None


def metrics_of(
    clock: Clock, store: Store, wire: Wire, watch: Watch, tracker: LivenessTracker,
    running: Running,
) -> Metrics:  # fmt: skip
    leadership, relay, bus, nodes = store.leadership, wire.relay, wire.bus, watch.nodes
    return Metrics(
        Sources(
            accepted=watch.ingest.accepted,
            dropped=watch.ingest.dropped,
            heartbeat_ages_s=lambda: tracker.ages_s(clock.now_ms()),
            agent_bus_errors=tracker.bus_errors,
            drift_corrections=lambda: running.drift_total[0],
            alerts_published=wire.stream.published_by_kind,
            loop_failures=running.loops.failures,
            nats_errors=bus.errors,
            nats_probe_failures=lambda: bus.probe_failures,
            nats_probe_late=lambda: bus.probe_late,
            bus_connected=lambda: tracker.bus_connected,
            is_leader=lambda: leadership.is_leader,
            outage_holds=lambda: nodes.outage_holds,
            interval_clamped=lambda: nodes.interval_clamped,
            outbox_backlog=lambda: relay.backlog.unsent,
            outbox_oldest_age_s=relay.oldest_age_s,
            alert_publish_failures=lambda: relay.failures,
            fenced_refusals=lambda: leadership.fenced_refusals,
            gpu_use=lambda: watch.gpu_use.lines,
            idle=lambda: watch.gpu_use.idle,
        )
    )


@asynccontextmanager
async def http_context(
    settings: CoordinatorSettings, clock: Clock, store: Store, wire: Wire, watch: Watch,
    capacity: CapacitySignal, metrics: Metrics,
) -> AsyncIterator[Served]:  # fmt: skip
    card = load_rate_card(settings.rate_card) if settings.rate_card else None
    if card is not None and settings.rate_card is not None:
        models = {p.gpu_model for p in await store.ledger.pools.list_all() if p.gpu_model}
        try:
            check_models(card, settings.rate_card, models)
        except RateCardError as exc:
            raise ConfigError("rate_card", str(exc)) from None
    services = Services(
        store.ledger, clock, wire.relay, capacity, notice_ms=int(settings.notice_s * 1000),
        metrics=metrics, feed=wire.feed, gpu_use=watch.gpu_use.book,
        busy=lambda: watch.gpu_use.unbooked, idle_since=watch.gpu_use.idle_since,
        rate_card=card,
    )  # fmt: skip
    limits = HttpLimits(
        idle_timeout_s=settings.http_idle_timeout_s,
        body_timeout_s=settings.http_body_timeout_s,
        metrics_token=settings.metrics_token,
        metrics_on_api=settings.metrics_port is None,
    )
    async with AsyncExitStack() as stack:
        # After the servers stop, the create batches their requests joined commit.
        stack.push_async_callback(bounded("create-batches", services.close))
        http = HttpServer(
            build_app(services, limits=limits), settings.http_host, settings.http_port,
            idle_timeout_s=settings.http_idle_timeout_s,
        )  # fmt: skip
        await http.start()
        stack.push_async_callback(bounded("http", http.stop))
        log.info("coordinator API on http://%s:%d", settings.http_host, http.port)
        metrics_http = None
        if settings.metrics_port is not None:
            metrics_http = HttpServer(
                metrics_app(services, limits), settings.metrics_host, settings.metrics_port,
                idle_timeout_s=settings.http_idle_timeout_s,
            )  # fmt: skip
            await metrics_http.start()
            stack.push_async_callback(bounded("metrics-http", metrics_http.stop))
            log.info("metrics on http://%s:%d/metrics", settings.metrics_host, metrics_http.port)
        yield Served(http, metrics_http)
