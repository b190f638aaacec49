"""The coordinator's settings: one frozen model, from which `shared.settings` builds the
flags, reads `GPUFLEET_*` env and the TOML file (`[coordinator]` table, or keys at the
top level), and writes the table in docs/operator.md. Built once in `main`; nothing
else in the coordinator reads the environment.

`python -m coordinator.config docs/operator.md` rewrites that table; a test fails when
the doc and the model disagree.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from shared.nats_servers import split_servers
from shared.settings import ConfigError, Option, SettingsModel, markdown_table, with_table
from shared.subjects import DEFAULT_PREFIX

__all__ = ["ConfigError", "CoordinatorSettings", "default_database_url"]


def default_database_url(state_dir: str) -> str:
    return f"sqlite:///{Path(state_dir) / 'gpufleet.db'}"


class CoordinatorSettings(SettingsModel):
    prog = "gpufleet-coordinator"
    summary = "The gpufleet ledger, capacity and reservation API, and alerts."
    toml_table = "coordinator"

    database_url: Annotated[str, Option(default_doc="SQLite `gpufleet.db` in `state_dir`")] = Field(
        "", description="`postgresql://user@host/db` or `sqlite:///path`"
    )
    state_dir: Annotated[str, Option(default_doc="`.` (systemd: `STATE_DIRECTORY`)")] = Field(
        ".", description="where the SQLite ledger lives when no database URL is set"
    )
    nats_url: str = Field(
        "nats://127.0.0.1:4222",
        description="NATS server URL; a comma-separated list of seeds (any one live seed is"
        " enough to start; the rest of the cluster is learnt from it)",
    )
    nats_credentials: str | None = Field(
        None, description="NATS credentials file (`.creds` or `gpufleet nats-auth` TOML)"
    )
    nats_tls_ca: str | None = Field(
        None, description="CA bundle (PEM) that NATS servers' certificates must chain to"
    )
    nats_tls_cert: str | None = Field(
        None, description="client certificate (PEM) for NATS servers that verify clients"
    )
    nats_tls_key: str | None = Field(None, description="private key (PEM) of `nats_tls_cert`")
    insecure_bus: bool = Field(
        False,
        description="start even when the NATS server lets anyone connect without credentials"
        " (tests; never in production: anyone on the network could forge heartbeats)",
    )
    nats_pending_msgs_limit: int = Field(
        200_000,
        ge=100,
        description="messages the client may hold unread per subscription before it drops"
        " them (a slow consumer: taken as the coordinator's own outage)",
    )
    ingest_backlog_limit: int = Field(
        10_000,
        ge=1,
        description="unread heartbeats and inventories beyond which the coordinator takes"
        " itself as fallen behind: nobody is marked unreachable until it catches up",
    )
    ingest_node_rate: float = Field(
        20.0,
        gt=0,
        le=10_000,
        description="messages per second one node may send on average (more are dropped"
        " and counted as `rate_limited`)",
    )
    ingest_node_burst: int = Field(
        100, ge=1, le=1_000_000, description="messages one node may send in a burst"
    )
    subject_prefix: str = Field(DEFAULT_PREFIX, description="NATS subject prefix")
    http_host: Annotated[str, Option(aliases=("--host",))] = Field(
        "127.0.0.1", description="address the HTTP API listens on"
    )
    http_port: Annotated[int, Option(aliases=("--port",))] = Field(
        8080, ge=0, le=65535, description="port of the HTTP API (0: any free port)"
    )
    http_idle_timeout_s: float = Field(
        15.0,
        gt=0,
        le=3600,
        description="seconds a connection may stay without a complete request header"
        " (idle keep-alive and slow-header clients are closed)",
    )
    http_body_timeout_s: float = Field(
        30.0, gt=0, le=3600, description="seconds a request body may take to arrive"
    )
    metrics_token: str | None = Field(
        None,
        description="bearer token that reads `/metrics` (an operator API key always does);"
        " `/metrics` names every tenant's pools",
    )
    metrics_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="serve `/metrics` on a listener of its own at this port (not on the"
        " API port); open there unless `metrics_token` is set",
    )
    metrics_host: str = Field(
        "127.0.0.1", description="address the `/metrics` listener binds (with `metrics_port`)"
    )
    misses: int = Field(
        3, ge=1, le=100, description="missed heartbeat intervals before a node is unreachable"
    )
    recovery_hold_s: float = Field(
        10.0,
        ge=0,
        le=3600,
        description="seconds of steady heartbeats before an unreachable node is back",
    )
    min_interval_s: float = Field(
        0.2,
        ge=0.1,
        le=3600,
        description="shortest heartbeat interval an agent is judged by (shorter ones are"
        " clamped up and counted)",
    )
    max_interval_s: float = Field(
        300.0,
        ge=0.1,
        le=3600,
        description="longest heartbeat interval an agent is judged by (longer ones are"
        " clamped down and counted)",
    )
    outage_fraction: float = Field(
        0.5,
        gt=0,
        le=1,
        description="a sweep that would mark more than this fraction of the reachable nodes"
        " unreachable at once is taken as the coordinator's own outage",
    )
    outage_min_nodes: int = Field(
        5,
        ge=1,
        description="the outage rule applies only when at least this many nodes would be"
        " marked at once",
    )
    nats_probe_interval_s: float = Field(
        1.0, gt=0, le=60, description="seconds between the coordinator's NATS round-trip probes"
    )
    nats_probe_timeout_s: float = Field(
        2.0,
        gt=0,
        le=60,
        description="seconds without an answer to a probe before the NATS link is taken as dead",
    )
    flush_interval_s: float = Field(
        1.0, gt=0, le=60, description="seconds between writes of nodes' last-seen times"
    )
    sweep_interval_s: float = Field(
        0.5, gt=0, le=60, description="seconds between sweeps for missed heartbeats"
    )
    rebuild_interval_s: float = Field(
        10.0, gt=0, le=3600, description="seconds between full rebuilds of the capacity rollup"
    )
    reservation_tick_s: float = Field(
        1.0, gt=0, le=60, description="seconds between reservation clock ticks"
    )
    notice_s: float = Field(
        120.0, ge=0, le=86400, description="notice a preempted spot reservation gets, seconds"
    )
    idempotency_keep_s: float = Field(
        86400.0,
        ge=86400,
        description="seconds an idempotency record is kept (the SPEC promises at least 24 h)",
    )
    idempotency_purge_interval_s: float = Field(
        600.0, gt=0, le=86400, description="seconds between purges of old idempotency records"
    )
    alert_stream_max_msgs: int = Field(
        100_000, ge=1, description="alerts kept in the JetStream stream"
    )
    alert_stream_max_age_s: float = Field(
        7 * 86400, gt=0, description="seconds an alert is kept in the JetStream stream"
    )
    alert_stream_replicas: Annotated[
        int | None, Option(default_doc="3 on a cluster of 3+ JetStream servers, else 1")
    ] = Field(
        None,
        ge=1,
        le=5,
        description="copies of the alert stream the cluster keeps; checked and corrected at start",
    )
    outbox_interval_s: float = Field(
        0.1, gt=0, le=60, description="seconds between looks at the alert outbox for unsent alerts"
    )
    alert_publish_timeout_s: float = Field(
        2.0,
        gt=0,
        le=60,
        description="seconds to wait for JetStream to acknowledge an alert before trying again",
    )
    bootstrap_operator_key: str | None = Field(
        None, description="an operator API key accepted at start (`gpufleet new-key`)"
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", description="log level")
    log_format: Literal["text", "json"] = Field(
        "text",
        description="`json`: one JSON object per line (access and audit lines keep their fields)",
    )

    @model_validator(mode="after")
    def _interval_bounds(self) -> CoordinatorSettings:
        if self.min_interval_s > self.max_interval_s:
            raise ValueError("min_interval_s must not exceed max_interval_s")
        if (self.nats_tls_cert is None) != (self.nats_tls_key is None):
            raise ValueError("nats_tls_cert and nats_tls_key go together")
        return self

    @field_validator("nats_url")
    @classmethod
    def _nats_url(cls, value: str) -> str:
        split_servers(value)
        return value

    @field_validator("nats_credentials", "nats_tls_ca", "nats_tls_cert", "nats_tls_key")
    @classmethod
    def _readable(cls, value: str | None) -> str | None:
        if value is not None and not Path(value).is_file():
            raise ValueError(f"{value} does not exist")
        return value

    @property
    def nats_servers(self) -> list[str]:
        return split_servers(self.nats_url)

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value

    @classmethod
    def environment_extras(cls, env: Mapping[str, str]) -> dict[str, Any]:
        # systemd's StateDirectory= says where to keep the SQLite file.
        if "STATE_DIRECTORY" in env:
            return {"state_dir": env["STATE_DIRECTORY"].split(":")[0]}
        return {}

    @property
    def effective_database_url(self) -> str:
        return self.database_url or default_database_url(self.state_dir)


BEGIN = "<!-- settings:begin (generated by `python -m coordinator.config docs/operator.md`) -->"
END = "<!-- settings:end -->"


def with_settings_table(text: str) -> str:
    return with_table(text, BEGIN, END, markdown_table(CoordinatorSettings))


if __name__ == "__main__":
    doc = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/operator.md")
    doc.write_text(with_settings_table(doc.read_text()))
