"""`gpufleet alerts forward` (also `gpufleet-alerts forward`): the alert bridge.

Reads the coordinator's JetStream alert stream through a durable pull consumer and
delivers every alert to Alertmanager (`POST /api/v2/alerts`) and/or webhooks (`POST` of
Alertmanager's webhook payload). Each target has its own delivery state and bounded
retry queue (`ops.forwarder.targets`): a message is acknowledged once every target has
delivered it, refused it (a 4xx other than 408/425/429) or dropped it from a full
queue. What was not acknowledged when the forwarder stopped is delivered again when it
starts (a batch in hand is handed back on SIGTERM, and comes back after the ack wait
when killed).

Alertmanager sees conditions: a kind that starts one fires an alert that is re-sent
every resend interval until the kind that ends it arrives (`ops.forwarder.conditions`).
Which conditions are firing is rebuilt at start from the stream's history.

A hung NATS server is noticed as the coordinator notices it: the link probe
(`procs.nats_link`, every `nats_probe_interval_s`, no answer within
`nats_probe_timeout_s`) takes the link as dead and has nats-py move to another server,
and so does a consumer that holds alerts and hands none over (`AlertSource.stalled`);
each move is logged and counted (`gpufleet_alerts_nats_link_failures`). Without it a
pull that times out reads as "nothing new" for as long as nats-py's own pings take
(issue 34: 110 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from functools import partial

import aiohttp
import msgspec
import nats
import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg

from ops.forwarder.conditions import Conditions
from ops.forwarder.metrics import ForwarderMetrics, TargetStat
from ops.forwarder.payloads import webhook_payload
from ops.forwarder.settings import ForwarderSettings
from ops.forwarder.targets import (
    AlertmanagerTarget,
    Backoff,
    Item,
    Pending,
    Target,
    WebhookTarget,
)
from ops.kit.alerts import AlertSource, ConsumerSpec, raise_if_cancelled
from ops.kit.redact import log, redact
from ops.kit.stream_reader import StoredMsg
from procs.nats_connect import RECONNECT_FOREVER, connect
from procs.nats_link import MAX_OUTSTANDING_PINGS, PING_INTERVAL_S, LinkProbe, server_of
from procs.settings import ConfigError
from procs.signals import serve as run_daemon
from shared.streams import stream_name
from shared.subjects import Subjects
from shared.wire import Alert

# The ack wait is one HTTP delivery and this: the messages a target holds are kept from
# redelivery (`in_progress`) before each POST and while it backs off, so only a message
# nobody holds comes again, and it should soon. Say one delivered on a link that hung
# just then (its server took it for us and never passed it on): it is redelivered
# after the ack wait, on the server the forwarder moved to (issue 34).
ACK_SLACK_S = 5.0


class AlertForwarder:
    def __init__(self, settings: ForwarderSettings) -> None:
        settings.check()  # also for settings built in code, which `load` did not check
        self.s = settings
        try:
            # A cluster's seeds, as the coordinator takes them: any live one will do.
            self._servers = settings.nats.servers
        except ValueError as exc:
            raise ConfigError("nats_url", str(exc)) from None
        self.subjects = Subjects(settings.nats.subject_prefix)
        self.conditions = Conditions(
            labels=dict(settings.labels), event_ttl_ms=int(settings.event_ttl_s * 1000)
        )
        backoff = Backoff(settings.backoff_initial_s, settings.backoff_max_s)
        self.alertmanagers = [
            AlertmanagerTarget(
                url=url.rstrip("/") + "/api/v2/alerts",
                backoff=backoff,
                max_queue=settings.max_queue,
                conditions=self.conditions,
                resend_s=settings.resend_interval_s,
                batch=settings.batch,
            )
            for url in settings.alertmanager
        ]
        self.webhooks = [
            WebhookTarget(url=url, backoff=backoff, max_queue=settings.max_queue)
            for url in settings.webhooks
        ]
        self.targets: list[Target] = [*self.alertmanagers, *self.webhooks]
        self.delivered = 0  # alerts every target is done with (acknowledged)
        self.source: AlertSource | None = None
        self.ready = asyncio.Event()  # set once bound and caught up with the history
        self._inflight: dict[int, Pending] = {}
        self._last_seq = 0
        self.nc: Client | None = None
        self.link = LinkProbe(log, timeout_s=settings.nats.probe_timeout_s)
        self.metrics = ForwarderMetrics()
        self.metrics_port: int | None = None  # once serving (metrics_port 0: a free one)
        m = self.metrics
        m.watch("gpufleet_alerts_delivered", "Alerts every target is done with",
                lambda: self.delivered)  # fmt: skip
        m.watch("gpufleet_alerts_refused", "Deliveries a target refused (retried)",
                lambda: self.refused)  # fmt: skip
        m.watch("gpufleet_alerts_dropped", "Alerts dropped from a full target queue",
                lambda: self.dropped)  # fmt: skip
        m.watch("gpufleet_alerts_queued", "Alerts waiting for a target, over all targets",
                lambda: sum(len(t.queue) for t in self.targets))  # fmt: skip
        m.watch("gpufleet_alerts_nats_up", "1 while connected to a NATS server",
                lambda: float(self.nc is not None and self.nc.is_connected))  # fmt: skip
        m.watch("gpufleet_alerts_nats_link_failures",
                "NATS links taken as dead (no answer to a probe, or a stalled consumer)",
                lambda: self.link.failures)  # fmt: skip
        m.targets(lambda: [
            TargetStat(t.name, t.delivered, t.refused, t.dropped, len(t.queue), t.up)
            for t in self.targets
        ])  # fmt: skip

    @property
    def refused(self) -> int:
        return sum(t.refused for t in self.targets)

    @property
    def dropped(self) -> int:
        return sum(t.dropped for t in self.targets)

    async def _connect(self) -> Client:
        async def on_error(exc: Exception) -> None:
            log.warning("NATS: %s", exc)

        async def on_disconnect() -> None:
            self.link.reset()
            if self.nc is not None and not self.nc.is_closed:  # closing is no news
                log.warning("disconnected from NATS")

        async def on_reconnect() -> None:
            log.info("reconnected to NATS at %s", self._server())

        options = dict(
            name="gpufleet-alerts", **RECONNECT_FOREVER, reconnect_time_wait=0.5,
            connect_timeout=5, error_cb=on_error, disconnected_cb=on_disconnect,
            reconnected_cb=on_reconnect, ping_interval=PING_INTERVAL_S,
            max_outstanding_pings=MAX_OUTSTANDING_PINGS,
        )  # fmt: skip
        nc = self.nc = await connect(self.s.nats, options, log=log)
        log.info("connected to NATS at %s", self._server())
        return nc

    def _server(self) -> str:
        return server_of(self.nc) if self.nc is not None else "?"

    async def run(self, ready: Callable[[], None] | None = None) -> None:
        """Forward until cancelled; messages not yet acknowledged are redelivered later.
        `/metrics` is served meanwhile when `metrics_port` is set."""
        async with contextlib.AsyncExitStack() as stack:
            if self.s.metrics_port is not None:
                self.metrics_port = await stack.enter_async_context(
                    self.metrics.serving(self.s.metrics_host, self.s.metrics_port)
                )
            await self._forward(ready)

    async def _forward(self, ready: Callable[[], None] | None) -> None:
        nc = await self._connect()
        try:
            stream = stream_name(self.s.nats.subject_prefix)
            source = self.source = AlertSource(
                nc,
                ConsumerSpec(
                    stream=stream, subject=self.subjects.all_alerts, durable=self.s.durable,
                    ack_wait_s=self.s.http_timeout_s + ACK_SLACK_S,
                    max_ack_pending=max(1000, 2 * (self.s.max_queue + self.s.batch)),
                ),
                wait_s=self.s.fetch_wait_s, history_timeout_s=4,
                on_mismatch=self.metrics.consumer_mismatches.inc,
            )  # fmt: skip
            source.resume_from = self._resume_from
            await source.bind()
            seen = await source.history(self._replay)
            log.info(
                "forwarding %s (consumer %s) to %d Alertmanager(s) and %d webhook(s); "
                "%d conditions firing after %s alerts of history",
                stream, self.s.durable, len(self.alertmanagers), len(self.webhooks),
                sum(1 for _ in self.conditions.firing()), "no" if seen is None else seen,
            )  # fmt: skip
            if ready is not None:
                ready()  # systemd: READY=1
            self.ready.set()
            timeout = aiohttp.ClientTimeout(total=self.s.http_timeout_s)
            try:
                async with aiohttp.ClientSession(timeout=timeout) as http:
                    async with asyncio.TaskGroup() as tasks:
                        for target in self.targets:
                            tasks.create_task(target.run(http), name=f"deliver {target.name}")
                        probe = self.link.run(lambda: self.nc, self.s.nats.probe_interval_s)
                        tasks.create_task(probe, name="nats-link-probe")
                        await self._pull(nc, source)
            except asyncio.CancelledError:
                # Stopping: hand back what is not done at once rather than after the
                # ack wait, so the next start (or a second forwarder) resends it.
                late = await source.hand_back(self.s.batch)
                for msg in [p.msg for p in self._inflight.values()] + late:
                    with contextlib.suppress(Exception):
                        await msg.nak()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(nc.flush(), timeout=2)
                raise
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(nc.close(), timeout=5)

    async def _pull(self, nc: Client, source: AlertSource) -> None:
        """Take what the consumer hands over; after pulls that brought nothing for a
        probe interval, ask whether it is stalled, and if so move to another server."""
        asked = time.monotonic()
        while True:
            raise_if_cancelled()
            msgs = await source.fetch(self.s.batch)
            if msgs:
                source.moving()
                asked = time.monotonic()
            for msg in msgs:
                await self._take(msg)
            if msgs or time.monotonic() - asked < self.s.nats.probe_interval_s:
                continue
            asked = time.monotonic()
            if nc.is_connected:
                why = await source.stalled(self.s.nats.probe_timeout_s)
                if why is not None and nc.is_connected:
                    await self.link.take_dead(nc, why)

    def _resume_from(self) -> int | None:
        if self._inflight:
            return min(self._inflight)
        return self._last_seq + 1 if self._last_seq else None

    def _replay(self, msg: StoredMsg) -> None:
        with contextlib.suppress(msgspec.DecodeError):
            self.conditions.apply(Alert.from_json(msg.data))

    async def _take(self, msg: Msg) -> None:
        seq = msg.metadata.sequence.stream
        self._last_seq = max(self._last_seq, seq)
        if seq in self._inflight:
            self._inflight[seq].msg = msg  # handed out again; acknowledge the new one
            return
        try:
            alert = Alert.from_json(msg.data)
        except msgspec.DecodeError as exc:
            log.error("not an alert on %s, skipped: %s", msg.subject, exc)
            await self._ack(msg)
            return
        outcome = self.conditions.apply(alert)
        pending = Pending(seq, msg, len(self.targets), self._done)
        self._inflight[seq] = pending
        for am in self.alertmanagers:
            if outcome.alertmanager:
                await am.put(Item(pending, alerts=outcome.alertmanager))
            else:
                await pending.finish()  # nothing for Alertmanager: older than its state
        if self.webhooks:
            body = webhook_payload(outcome.notified, outcome.status, "")
            for hook in self.webhooks:
                await hook.put(Item(pending, body=body))

    async def _done(self, pending: Pending) -> None:
        self._inflight.pop(pending.seq, None)
        await self._ack(pending.msg)
        self.delivered += 1

    @staticmethod
    async def _ack(msg: Msg) -> None:
        try:
            await msg.ack()
        except (nats.errors.Error, TimeoutError) as exc:
            log.warning("acknowledging %s failed (%s); it will come again", msg.subject, exc)


def serve(settings: ForwarderSettings, env: Mapping[str, str]) -> int:
    """Forward until SIGTERM or SIGINT (0); 2 when the settings cannot be used."""

    def stopped(forwarder: AlertForwarder) -> None:
        log.info(
            "stopped; %d alerts delivered, %d refused, %d dropped",
            forwarder.delivered, forwarder.refused, forwarder.dropped,
        )  # fmt: skip

    start = partial(AlertForwarder, settings)
    return run_daemon("gpufleet alerts", settings.log_level, start, stopped, env, redact)
