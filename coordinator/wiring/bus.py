"""NATS as a resource: connected (and refused when anyone could connect), the alert
stream set up, the outbox relay that publishes to it, and the alert feed the console
reads; closed on the way out."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from coordinator.api.http.alert_feed import AlertFeed
from coordinator.bus.alerts import AlertStream, feed_from_bus
from coordinator.bus.connection import Bus
from coordinator.config import CoordinatorSettings
from coordinator.domain.liveness import LivenessTracker
from coordinator.tasks.outbox_relay import OutboxRelay
from coordinator.tasks.shutdown import bounded
from coordinator.wiring.ledger import Store
from procs.redact import redact
from procs.settings import ConfigError
from shared.clock import Clock
from shared.subjects import Subjects

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Wire:
    bus: Bus
    stream: AlertStream
    # The services' alert sink: alerts are committed to the outbox with their
    # transitions; announcing one only wakes the relay that publishes them.
    relay: OutboxRelay
    feed: AlertFeed


def check_bus_security(bus: Bus, settings: CoordinatorSettings) -> None:
    """Refuse an open bus: on a NATS server without authentication anyone who can reach
    it can forge any node's heartbeats and inventories."""
    if bus.auth_required:
        if not bus.tls and not _loopback(settings.nats.url):
            log.warning(
                "NATS at %s is not on this host and not TLS: passwords cross the network in clear",
                redact(settings.nats.url),
            )
        return
    if settings.insecure_bus:
        log.warning(
            "NATS at %s requires no credentials (insecure_bus is set): anyone who can"
            " reach it can forge heartbeats and inventories",
            redact(settings.nats.url),
        )
        return
    raise ConfigError(
        "nats_url",
        f"NATS at {redact(settings.nats.url)} lets anyone connect without credentials, so anyone"
        " could forge node heartbeats and inventories: run it with per-agent credentials"
        " (`gpufleet nats-auth`) and give `nats_credentials`, or pass `--insecure-bus`",
    )


def _loopback(url: str) -> bool:
    hosts = [u.split("://", 1)[-1].rsplit("@", 1)[-1].rsplit(":", 1)[0] for u in url.split(",")]
    return all(h in ("127.0.0.1", "localhost", "[::1]", "::1") for h in hosts)


@asynccontextmanager
async def bus_context(
    settings: CoordinatorSettings, clock: Clock, subjects: Subjects, store: Store,
    tracker: LivenessTracker, on_behind: Callable[[str], None],
) -> AsyncIterator[Wire]:  # fmt: skip
    bus = Bus(
        settings.nats,
        on_up=lambda: tracker.bus_up(clock.now_ms()),
        on_down=tracker.bus_down,
        on_behind=on_behind,
        probe_timeout_s=settings.nats.probe_timeout_s,
        pending_msgs_limit=settings.nats_pending_msgs_limit,
    )
    stream = AlertStream(
        bus, subjects, max_msgs=settings.alert_stream_max_msgs,
        max_age_s=settings.alert_stream_max_age_s, replicas=settings.alert_stream_replicas,
        publish_timeout_s=settings.alert_publish_timeout_s,
    )  # fmt: skip
    relay = OutboxRelay(
        store.ledger, stream, clock, store.leadership, interval_s=settings.outbox_interval_s
    )
    await bus.connect()
    try:
        check_bus_security(bus, settings)
        try:
            await asyncio.wait_for(stream.setup(), timeout=10)
        except Exception as exc:
            # JetStream may be electing or away; the relay sets it up before publishing.
            log.warning("alert stream %s not set up yet: %s", stream.name, exc)
        feed = AlertFeed()
        await bus.subscribe(subjects.all_alerts, feed_from_bus(feed.add))
        yield Wire(bus, stream, relay, feed)
    finally:
        await bounded("bus", bus.close)()
