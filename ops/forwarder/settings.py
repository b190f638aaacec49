"""The alert forwarder's settings: one frozen model, read as every gpufleet daemon's are
(`procs.settings`): the `[alerts]` table (or top-level keys) of the TOML file named by
`--config` or `GPUFLEET_ALERTS_CONFIG`, then `GPUFLEET_*` env, then flags. The flags of
`gpufleet alerts forward` and the table in docs/operator.md are generated from it.

`python -m ops.forwarder.settings docs/operator.md` rewrites that table; a test fails
when the doc and the model disagree.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import msgspec
from msgspec import Meta

from procs.logs import LogLevel
from procs.nats import ProbedNatsSettings
from procs.settings import ConfigError, DocTable, Option, SettingsModel

__all__ = ["ForwarderSettings"]

Seconds = Annotated[float, Meta(gt=0, le=86400)]


def _http_urls(urls: Sequence[str]) -> None:
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"{url!r} is not an http(s) URL")


def _label(text: str) -> dict[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"{text!r} is not KEY=VALUE")
    return {key.strip(): value.strip()}


class ForwarderSettings(SettingsModel, frozen=True):
    prog = "gpufleet alerts forward"
    summary = "Deliver the alert stream to Alertmanager and/or webhooks."
    toml_table = "alerts"
    # Not GPUFLEET_CONFIG: that names the coordinator's file, on the same host.
    config_env = "GPUFLEET_ALERTS_CONFIG"

    nats: ProbedNatsSettings = msgspec.field(default_factory=ProbedNatsSettings)
    durable: Annotated[
        str, Meta(min_length=1, description="name of the durable JetStream consumer")
    ] = "alert-forwarder"
    alertmanager: Annotated[
        tuple[str, ...],
        Meta(description="Alertmanager base URLs (alerts POSTed to `URL/api/v2/alerts`)"),
        Option(metavar="URL", item=str, env="GPUFLEET_ALERTMANAGER_URLS", check=_http_urls),
    ] = ()
    webhooks: Annotated[
        tuple[str, ...],
        Meta(description="webhook URLs (Alertmanager's webhook payload POSTed)"),
        Option(
            flag="--webhook",
            metavar="URL",
            item=str,
            env="GPUFLEET_ALERT_WEBHOOKS",
            check=_http_urls,
        ),
    ] = ()
    batch: Annotated[
        int, Meta(ge=1, le=10000, description="alerts pulled from the stream at a time")
    ] = 100
    http_timeout_s: Annotated[Seconds, Meta(description="seconds per HTTP delivery")] = 10.0
    backoff_initial_s: Annotated[
        Seconds, Meta(description="first retry delay of a failing target, doubling")
    ] = 0.5
    backoff_max_s: Annotated[Seconds, Meta(description="longest retry delay")] = 60.0
    event_ttl_s: Annotated[
        Seconds, Meta(description="seconds a one-shot event alert stays in Alertmanager")
    ] = 3600.0
    resend_interval_s: Annotated[
        Seconds,
        Meta(
            description=(
                "firing conditions are re-sent this often, each ending 4 intervals ahead "
                "(Prometheus' resend delay and rule)"
            )
        ),
    ] = 60.0
    max_queue: Annotated[
        int,
        Meta(
            ge=1,
            le=1_000_000,
            description="alerts one target holds while it cannot deliver; then the oldest drops",
        ),
    ] = 500
    fetch_wait_s: Annotated[
        float, Meta(gt=0, le=60, description="seconds one pull waits for new alerts")
    ] = 1.0
    labels: Annotated[
        dict[str, str],
        Meta(description="extra labels on every Alertmanager alert (an `[alerts.labels]` table)"),
        Option(flag="--label", metavar="K=V", item=_label),
    ] = msgspec.field(default_factory=dict)
    metrics_host: Annotated[str, Meta(description="address of the /metrics listener")] = "127.0.0.1"
    metrics_port: Annotated[
        Annotated[int, Meta(ge=0, le=65535)] | None,
        Meta(description="port of /metrics (unset: none; 0: any free one)"),
    ] = None
    log_level: LogLevel = "INFO"

    def check(self) -> None:
        if not self.alertmanager and not self.webhooks:
            raise ConfigError("alertmanager", "no target: give --alertmanager and/or --webhook")
        if self.backoff_initial_s > self.backoff_max_s:
            raise ConfigError("backoff_initial_s", "must not exceed backoff_max_s")


DOC_TABLE = DocTable(
    ForwarderSettings, "alerts-settings", "ops.forwarder.settings", "docs/operator.md"
)


if __name__ == "__main__":
    DOC_TABLE.main()
