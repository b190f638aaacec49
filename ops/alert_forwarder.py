"""`gpufleet alerts forward` (also `gpufleet-alerts forward`): the alert bridge.

Reads the coordinator's JetStream alert stream through a durable pull consumer and
delivers every alert to Alertmanager (`POST /api/v2/alerts`) and/or webhooks (`POST` of
the alert's JSON), at least once: a message is acknowledged only after every target took
it, failed deliveries are retried with capped exponential backoff (connection errors,
timeouts, 408, 425, 429 and 5xx), and what was not acknowledged when the forwarder stopped
is delivered again when it starts (the consumer's position lives in NATS; a batch in
hand is handed back on SIGTERM, and comes back after the ack wait when killed). A target that
refuses the content itself (another 4xx) cannot be helped by retrying: that alert is
logged at error and acknowledged.

Alertmanager sees conditions, not events: a transition that starts a condition
(`node.unreachable`) fires an alert with the labels `alertname`, `severity`, `pool`,
`node` (and `device`), and the transition that ends it (`node.reachable`) sends the same
labels with `endsAt` set, which resolves it. One-shot events (`node.registered`,
`reservation.notice`, ...) fire with `endsAt` an hour later.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import random
import signal
import sys
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import aiohttp
import msgspec
import nats
import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from coordinator.bus.alerts import stream_name
from shared.credentials import CredentialsError, connect_options
from shared.subjects import Subjects
from shared.systemd import sd_notify
from shared.wire import Alert

log = logging.getLogger("gpufleet.alerts")

# kind -> (alertname, severity) of the condition it starts.
FIRES: dict[str, tuple[str, str]] = {
    "node.unreachable": ("GpufleetNodeUnreachable", "critical"),
    "node.unhealthy": ("GpufleetNodeUnhealthy", "critical"),
    "node.unmonitored": ("GpufleetNodeUnhealthy", "critical"),
    "node.degraded": ("GpufleetNodeDegraded", "warning"),
    "device.unhealthy": ("GpufleetDeviceUnhealthy", "warning"),
    "device.degraded": ("GpufleetDeviceDegraded", "warning"),
    "device.missing": ("GpufleetDeviceMissing", "warning"),
    "node.maintenance": ("GpufleetNodeMaintenance", "info"),
    "node.provisioning": ("GpufleetNodeProvisioning", "info"),
    "reservation.atRisk": ("GpufleetReservationAtRisk", "warning"),
}
# kind -> the kinds whose conditions it ends.
RESOLVES: dict[str, tuple[str, ...]] = {
    "node.reachable": ("node.unreachable",),
    "node.healthy": ("node.unhealthy", "node.degraded"),
    "device.healthy": ("device.unhealthy", "device.degraded", "device.missing"),
    "node.maintenanceEnded": ("node.maintenance",),
    "node.provisioned": ("node.provisioning",),
    "reservation.recovered": ("reservation.atRisk",),
}
RETRY_STATUSES = frozenset({408, 425, 429})


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class ForwarderSettings:
    nats_url: str = "nats://127.0.0.1:4222"
    nats_credentials: str | None = None
    subject_prefix: str = "gpufleet"
    durable: str = "alert-forwarder"
    alertmanager: tuple[str, ...] = ()
    webhooks: tuple[str, ...] = ()
    batch: int = 100
    http_timeout_s: float = 10.0
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 60.0
    event_ttl_s: float = 3600.0
    condition_ttl_s: float = 7 * 86400.0
    # Extra labels on every Alertmanager alert (say, cluster="eu-1").
    labels: Mapping[str, str] = field(default_factory=dict)


def rfc3339(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


def _event_name(kind: str) -> str:
    return "Gpufleet" + "".join(p[:1].upper() + p[1:] for p in kind.split("."))


def alertmanager_alerts(alert: Alert, s: ForwarderSettings) -> list[dict[str, Any]]:
    """The Alertmanager API v2 alerts one gpufleet alert becomes."""
    base = {"pool": alert.pool_id, "node": alert.node_id} | dict(s.labels)
    if alert.device_id:
        base["device"] = alert.device_id
    if alert.reservation_id:
        base["reservation"] = alert.reservation_id
    annotations = {
        "summary": f"{alert.kind} on node {alert.node_id} (pool {alert.pool_id})",
        "description": alert.reason or alert.kind,
        "kind": alert.kind,
        "by": alert.by,
        "alertId": alert.alert_id,
    }
    start = alert.since or alert.at
    if alert.kind in RESOLVES:
        out = []
        for ended in RESOLVES[alert.kind]:
            name, severity = FIRES[ended]
            labels = base | {"alertname": name, "severity": severity}
            out.append(
                {"labels": labels, "annotations": annotations,
                 "startsAt": rfc3339(alert.at), "endsAt": rfc3339(alert.at)}
            )  # fmt: skip
        return out
    name, severity = FIRES.get(alert.kind, (_event_name(alert.kind), "info"))
    ttl = s.condition_ttl_s if alert.kind in FIRES else s.event_ttl_s
    return [
        {
            "labels": base | {"alertname": name, "severity": severity},
            "annotations": annotations,
            "startsAt": rfc3339(start),
            "endsAt": rfc3339(alert.at + int(ttl * 1000)),
        }
    ]


class _Refused(Exception):
    """A target refused the content (a 4xx that retrying cannot change)."""


class AlertForwarder:
    def __init__(self, settings: ForwarderSettings) -> None:
        if not settings.alertmanager and not settings.webhooks:
            raise ConfigError("no target: give --alertmanager and/or --webhook")
        self.s = settings
        self.subjects = Subjects(settings.subject_prefix)
        self.delivered = 0
        self.refused = 0
        self._connect_options: dict[str, Any] = {}
        if settings.nats_credentials:
            with open(settings.nats_credentials) as f:
                text = f.read()
            self._connect_options = connect_options(
                text, settings.nats_credentials, "nats_credentials"
            )

    async def run(self, notify_socket: str | None = None) -> None:
        """Forward until cancelled; messages not yet acknowledged are redelivered later."""
        nc = await nats.connect(
            servers=[self.s.nats_url], name="gpufleet-alerts", max_reconnect_attempts=-1,
            reconnect_time_wait=1, **self._connect_options,
        )  # fmt: skip
        try:
            js = nc.jetstream(timeout=10)
            ack_wait = max(30.0, self.s.http_timeout_s * 3)
            sub = await js.pull_subscribe(
                self.subjects.all_alerts,
                durable=self.s.durable,
                stream=stream_name(self.s.subject_prefix),
                config=ConsumerConfig(
                    ack_policy=AckPolicy.EXPLICIT,
                    deliver_policy=DeliverPolicy.ALL,
                    ack_wait=ack_wait,
                    max_ack_pending=max(1000, self.s.batch * 2),
                ),
            )
            log.info(
                "forwarding %s (consumer %s) to %d Alertmanager(s) and %d webhook(s)",
                stream_name(self.s.subject_prefix), self.s.durable,
                len(self.s.alertmanager), len(self.s.webhooks),
            )  # fmt: skip
            sd_notify("READY=1", notify_socket)
            timeout = aiohttp.ClientTimeout(total=self.s.http_timeout_s)
            async with aiohttp.ClientSession(timeout=timeout) as http:
                while True:
                    try:
                        msgs = await sub.fetch(self.s.batch, timeout=1)
                    except nats.errors.TimeoutError:
                        continue
                    except (nats.errors.Error, nats.js.errors.Error) as exc:
                        log.warning("fetching alerts failed: %s; retrying", exc)
                        await asyncio.sleep(1)
                        continue
                    try:
                        await self._deliver(http, msgs)
                    except asyncio.CancelledError:
                        # Stopping mid-delivery: hand the batch back at once rather than
                        # after the ack wait, so the next start (or replica) resends it.
                        for msg in msgs:
                            with contextlib.suppress(Exception):
                                await msg.nak()
                        with contextlib.suppress(Exception):
                            await asyncio.wait_for(nc.flush(), timeout=2)
                        raise
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(nc.close(), timeout=5)

    async def _deliver(self, http: aiohttp.ClientSession, msgs: list[Msg]) -> None:
        alerts: list[Alert] = []
        for msg in msgs:
            try:
                alerts.append(Alert.from_json(msg.data))
            except msgspec.DecodeError as exc:
                log.error("not an alert on %s, skipped: %s", msg.subject, exc)
        if alerts:
            body = [a for alert in alerts for a in alertmanager_alerts(alert, self.s)]
            for url in self.s.alertmanager:
                await self._post(http, url.rstrip("/") + "/api/v2/alerts", body, msgs)
            for url in self.s.webhooks:
                for alert in alerts:
                    await self._post(http, url, msgspec.to_builtins(alert), msgs)
        for msg in msgs:
            await msg.ack()
        self.delivered += len(alerts)

    async def _post(
        self, http: aiohttp.ClientSession, url: str, body: Any, msgs: list[Msg]
    ) -> None:
        delay = self.s.backoff_initial_s
        while True:
            try:
                async with http.post(url, json=body) as resp:
                    if resp.status < 300:
                        return
                    text = (await resp.text())[:200]
                    if resp.status < 500 and resp.status not in RETRY_STATUSES:
                        self.refused += 1
                        log.error("%s refused the alerts (%d %s); skipped", url, resp.status, text)
                        return
                    problem = f"{resp.status} {text}"
            except (aiohttp.ClientError, TimeoutError) as exc:
                problem = str(exc) or type(exc).__name__
            log.warning("delivery to %s failed (%s); retrying in %.1f s", url, problem, delay)
            # Tell JetStream we are still at it, so it does not hand the batch out again.
            for msg in msgs:
                with contextlib.suppress(Exception):
                    await msg.in_progress()
            await asyncio.sleep(delay * random.uniform(0.8, 1.2))
            delay = min(delay * 2, self.s.backoff_max_s)


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="alerts_command", required=True)
    fwd = sub.add_parser("forward", help="deliver the alert stream to Alertmanager/webhooks")
    fwd.add_argument("--config", help="TOML file ([alerts] table; env GPUFLEET_ALERTS_CONFIG)")
    fwd.add_argument("--nats-url", help="env GPUFLEET_NATS_URL")
    fwd.add_argument("--nats-credentials", help="credentials file (env GPUFLEET_NATS_CREDENTIALS)")
    fwd.add_argument("--subject-prefix", help="env GPUFLEET_SUBJECT_PREFIX")
    fwd.add_argument("--durable", help="consumer name (default alert-forwarder)")
    fwd.add_argument(
        "--alertmanager", action="append",
        help="Alertmanager base URL, repeatable (env GPUFLEET_ALERTMANAGER_URLS, comma-separated)",
    )  # fmt: skip
    fwd.add_argument(
        "--webhook", action="append",
        help="webhook URL, repeatable (env GPUFLEET_ALERT_WEBHOOKS, comma-separated)",
    )  # fmt: skip
    fwd.add_argument("--log-level", default=None)


def _urls(value: Any, where: str) -> tuple[str, ...]:
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not all(isinstance(u, str) for u in items):
        raise ConfigError(f"{where}: a list of URLs")
    urls = tuple(u.strip() for u in items if u.strip())
    for u in urls:
        if not u.startswith(("http://", "https://")):
            raise ConfigError(f"{where}: {u!r} is not an http(s) URL")
    return urls


_TOML_KEYS = {
    "nats_url", "nats_credentials", "subject_prefix", "durable", "alertmanager", "webhooks",
    "batch", "http_timeout_s", "backoff_initial_s", "backoff_max_s", "event_ttl_s",
    "condition_ttl_s", "labels", "log_level",
}  # fmt: skip


def settings_from(args: argparse.Namespace, env: Mapping[str, str]) -> ForwarderSettings:
    """Flags win over GPUFLEET_* variables, which win over the TOML file."""
    data: dict[str, Any] = {}
    path = args.config or env.get("GPUFLEET_ALERTS_CONFIG")
    if path:
        try:
            with open(path, "rb") as f:
                doc = tomllib.load(f)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"{path}: {exc}") from None
        data = dict(doc.get("alerts", doc))
        unknown = set(data) - _TOML_KEYS
        if unknown:
            raise ConfigError(f"{path}: unknown keys {sorted(unknown)}")
    for key, var in (
        ("nats_url", "GPUFLEET_NATS_URL"),
        ("nats_credentials", "GPUFLEET_NATS_CREDENTIALS"),
        ("subject_prefix", "GPUFLEET_SUBJECT_PREFIX"),
        ("alertmanager", "GPUFLEET_ALERTMANAGER_URLS"),
        ("webhooks", "GPUFLEET_ALERT_WEBHOOKS"),
    ):
        if env.get(var):
            data[key] = env[var]
    for key, flag in (
        ("nats_url", args.nats_url), ("nats_credentials", args.nats_credentials),
        ("subject_prefix", args.subject_prefix), ("durable", args.durable),
        ("alertmanager", args.alertmanager), ("webhooks", args.webhook),
    ):  # fmt: skip
        if flag:
            data[key] = flag
    data.pop("log_level", None)
    s = ForwarderSettings()
    try:
        for name in ("alertmanager", "webhooks"):
            if name in data:
                data[name] = _urls(data[name], name)
        return replace(s, **data)
    except TypeError as exc:
        raise ConfigError(str(exc)) from None


def command(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    logging.basicConfig(
        level=(args.log_level or "INFO").upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        settings = settings_from(args, env)
        forwarder = AlertForwarder(settings)
    except (ConfigError, CredentialsError, OSError) as exc:
        print(f"gpufleet alerts: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(_serve(forwarder, env.get("NOTIFY_SOCKET")))


async def _serve(forwarder: AlertForwarder, notify_socket: str | None) -> int:
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    try:
        await forwarder.run(notify_socket)
    except asyncio.CancelledError:
        sd_notify("STOPPING=1", notify_socket)
        log.info("stopped; %d alerts delivered", forwarder.delivered)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gpufleet-alerts", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    return command(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
