"""Alert publishing: core NATS subjects, captured by a bounded JetStream stream so that a
subscriber that was away can read what it missed."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from nats.aio.msg import Msg
from pydantic import ValidationError

from coordinator.alert_feed import AlertFeed
from coordinator.bus.connection import Bus
from shared.subjects import Subjects
from shared.wire import Alert

log = logging.getLogger(__name__)


def stream_name(prefix: str) -> str:
    """One stream per subject prefix, so deployments sharing a NATS server stay apart."""
    return "".join(c if c.isalnum() else "_" for c in prefix).upper() + "_ALERTS"


class AlertPublisher:
    def __init__(self, bus: Bus, subjects: Subjects) -> None:
        self.bus = bus
        self.subjects = subjects
        self.published = 0
        self.published_by_kind: dict[str, int] = {}

    async def setup(self, max_msgs: int = 100_000, max_age_s: float = 7 * 86400) -> None:
        await self.bus.ensure_stream(
            stream_name(self.subjects.prefix), [self.subjects.all_alerts], max_msgs, max_age_s
        )

    async def publish(self, alert: Alert) -> None:
        subject = self.subjects.alert(alert.pool_id, alert.node_id, alert.kind)
        try:
            await self.bus.publish(subject, alert.to_json())
            self.published += 1
            self.published_by_kind[alert.kind] = self.published_by_kind.get(alert.kind, 0) + 1
        except Exception as exc:
            # The transition is already in the ledger (node events); the alert is best effort
            # while the bus is away.
            log.warning("could not publish alert %s: %s", alert.kind, exc)


def feed_from_bus(feed: AlertFeed) -> Callable[[Msg], Awaitable[None]]:
    """A subscription handler that keeps `feed` (the console's) up to date."""

    async def on_alert(msg: Msg) -> None:
        try:
            feed.add(Alert.model_validate_json(msg.data))
        except ValidationError:
            log.warning("not an alert on %s", msg.subject)

    return on_alert
