"""The alert stream: alerts published to JetStream, each acknowledged once stored, with
its alert id as `Nats-Msg-Id` so that the stream keeps one copy however often it is
sent (the outbox relay sends again whatever it did not see acknowledged). Core NATS
subscribers of `<prefix>.alert.>` receive the same messages live; a subscriber that
was away reads what it missed from the stream.

`setup` creates the stream, or checks an existing one and corrects its limits and its
replica count: `replicas` copies (None: 3 when the cluster has 3 or more servers, else
1). A stream that cannot get its replicas now (a server down at start) keeps what it
has; the relay calls `setup` again before its next publish until it succeeds.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import msgspec
import nats
from nats.aio.msg import Msg
from nats.js.api import RetentionPolicy, StorageType, StreamConfig

from coordinator.bus.connection import Bus
from shared.streams import stream_name
from shared.subjects import Subjects
from shared.wire import Alert

log = logging.getLogger(__name__)

MSG_ID = "Nats-Msg-Id"
# Sends of one alert id within this window are stored once. Longer than any retry
# schedule of the relay and any leader handover, so a resend is always recognised.
DUPLICATE_WINDOW_S = 600.0


class AlertNotStored(Exception):
    """JetStream did not acknowledge the alert (timeout, no stream, cluster down)."""


def wanted_replicas(setting: int | None, cluster_size: int) -> int:
    if setting is not None:
        return setting
    return 3 if cluster_size >= 3 else 1


class AlertStream:
    def __init__(
        self,
        bus: Bus,
        subjects: Subjects,
        *,
        max_msgs: int = 100_000,
        max_age_s: float = 7 * 86400,
        replicas: int | None = None,
        publish_timeout_s: float = 2.0,
    ) -> None:
        self.bus = bus
        self.subjects = subjects
        self.name = stream_name(subjects.prefix)
        self._max_msgs = max_msgs
        self._max_age_s = max_age_s
        self._replicas = replicas
        self._timeout_s = publish_timeout_s
        self.ready = False
        self.replicas = 0  # as the stream has them, once set up
        self.published = 0
        self.duplicates = 0
        self.published_by_kind: dict[str, int] = {}

    def _config(self, replicas: int) -> StreamConfig:
        return StreamConfig(
            name=self.name,
            subjects=[self.subjects.all_alerts],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            max_msgs=self._max_msgs,
            max_age=self._max_age_s,
            num_replicas=replicas,
            duplicate_window=DUPLICATE_WINDOW_S,
            # Readers and forwarders read its history by (batched) direct get: their NATS
            # users may create no consumer but their own named one.
            allow_direct=True,
        )

    async def setup(self) -> None:
        """Create the stream or bring an existing one to the settings."""
        js = self.bus.jetstream(timeout_s=5)
        want = wanted_replicas(self._replicas, self.bus.cluster_size())
        try:
            info = await js.stream_info(self.name)
        except nats.js.errors.NotFoundError:
            info = await js.add_stream(self._config(want))
            log.info("alert stream %s created with %d replicas", self.name, want)
        else:
            have = info.config.num_replicas or 1
            if self._replicas is None and want < have:
                want = have  # never scale down on a guess; only a setting does that
            c = info.config
            if (have, c.max_msgs, c.max_age, c.duplicate_window, bool(c.allow_direct)) != (
                want, self._max_msgs, self._max_age_s, DUPLICATE_WINDOW_S, True,
            ):  # fmt: skip
                info = await js.update_stream(self._config(want))
                log.info("alert stream %s updated: %d replicas (was %d)", self.name, want, have)
        self.replicas = info.config.num_replicas or 1
        self.ready = True

    async def publish(self, alert: Alert) -> bool:
        """Store one alert; returns True when the stream already had it (a resend).
        Raises `AlertNotStored` when not acknowledged in time."""
        js = self.bus.jetstream(timeout_s=self._timeout_s)
        subject = self.subjects.alert(alert.pool_id, alert.node_id, alert.kind)
        try:
            ack = await js.publish(
                subject,
                alert.to_json(),
                timeout=self._timeout_s,
                stream=self.name,
                headers={MSG_ID: alert.alert_id},
            )
        except (nats.errors.Error, TimeoutError, RuntimeError) as exc:
            raise AlertNotStored(f"{alert.alert_id}: {type(exc).__name__}: {exc}") from exc
        self.published += 1
        self.published_by_kind[alert.kind] = self.published_by_kind.get(alert.kind, 0) + 1
        if ack.duplicate:
            self.duplicates += 1
        return bool(ack.duplicate)


def feed_from_bus(add: Callable[[Alert], None]) -> Callable[[Msg], Awaitable[None]]:
    """A subscription handler that hands every alert on the bus to `add` (the console's
    feed, which lives with the API: the bus does not import it)."""

    async def on_alert(msg: Msg) -> None:
        try:
            add(Alert.from_json(msg.data))
        except msgspec.DecodeError:
            log.warning("not an alert on %s", msg.subject)

    return on_alert
