"""The coordinator's settings: one frozen model, from which `procs.settings` builds the
flags, reads `GPUFLEET_*` env and the TOML file (`[coordinator]` table, or keys at the
top level), and writes the table in docs/operator.md. Built once in `main`; nothing
else in the coordinator reads the environment.

`python -m coordinator.config docs/operator.md` rewrites that table; a test fails when
the doc and the model disagree.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from coordinator.domain.rate_card import RateCard, RateCardError, parse_rate_card
from coordinator.domain.tenant_rules import TenantRules, TenantRulesError, parse_tenant_rules
from procs.logs import LogLevel
from procs.nats import ProbedNatsSettings
from procs.settings import ConfigError, DocTable, Option, SettingsModel
from shared.wire import IDLE_UTIL_PERCENT

__all__ = [
    "ConfigError", "CoordinatorSettings", "default_database_url", "load_rate_card",
    "load_tenant_rules",
]  # fmt: skip


Port = Annotated[int, Meta(ge=0, le=65535)]


def default_database_url(state_dir: str) -> str:
    return f"sqlite:///{Path(state_dir) / 'gpufleet.db'}"


def _text(path: str, error: type[ValueError]) -> str:
    """An operator's file, or `error` naming it."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise error(f"{path}: cannot be read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise error(f"{path}: is not UTF-8 text") from None


def load_rate_card(path: str) -> RateCard:
    """The rate card file at `path`, or ValueError (RateCardError) naming file, line
    and field: the coordinator refuses to start on a card it cannot use."""
    return parse_rate_card(_text(path, RateCardError), path)


def _rate_card(value: str | None) -> None:
    if value is not None:
        load_rate_card(value)


def load_tenant_rules(path: str) -> TenantRules:
    """The tenant mapping rules at `path`, or ValueError (TenantRulesError) naming file,
    line and field: the coordinator refuses to start on rules it cannot use."""
    return parse_tenant_rules(_text(path, TenantRulesError), path)


def _tenant_rules(value: str | None) -> None:
    if value is not None:
        load_tenant_rules(value)


class CoordinatorSettings(SettingsModel, frozen=True):
    prog = "gpufleet-coordinator"
    summary = "The gpufleet ledger, capacity and reservation API, and alerts."
    toml_table = "coordinator"

    database_url: Annotated[
        str,
        Meta(description="`postgresql://user@host/db` or `sqlite:///path`"),
        Option(default_doc="SQLite `gpufleet.db` in `state_dir`"),
    ] = ""
    state_dir: Annotated[
        str,
        Meta(description="where the SQLite ledger lives when no database URL is set"),
        Option(default_doc="`.` (systemd: `STATE_DIRECTORY`)"),
    ] = "."
    nats: ProbedNatsSettings = msgspec.field(default_factory=ProbedNatsSettings)
    rate_card: Annotated[
        str | None,
        Meta(
            description=(
                "TOML rate card: reserved and on-demand unit prices per resource and GPU "
                "model, effective dates (docs/operator.md, Chargeback); none: quantities only"
            )
        ),
        Option(check=_rate_card),
    ] = None
    tenant_rules: Annotated[
        str | None,
        Meta(
            description=(
                "TOML rules charging memory use no reservation names to a tenant, by Slurm "
                "account, Kubernetes namespace or unix group (docs/operator.md, Chargeback)"
            )
        ),
        Option(check=_tenant_rules),
    ] = None
    insecure_bus: Annotated[
        bool,
        Meta(
            description=(
                "start even when the NATS server lets anyone connect without credentials (tests; "
                "never in production: anyone on the network could forge heartbeats)"
            )
        ),
    ] = False
    nats_pending_msgs_limit: Annotated[
        int,
        Meta(
            ge=100,
            description=(
                "messages the client may hold unread per subscription before it drops them (a slow "
                "consumer: taken as the coordinator's own outage)"
            ),
        ),
    ] = 200000
    ingest_backlog_limit: Annotated[
        int,
        Meta(
            ge=1,
            description=(
                "unread heartbeats and inventories beyond which the coordinator takes itself as "
                "fallen behind: nobody is marked unreachable until it catches up"
            ),
        ),
    ] = 10000
    ingest_node_rate: Annotated[
        float,
        Meta(
            gt=0,
            le=10000,
            description=(
                "messages per second one node may send on average (more are dropped and counted as "
                "`rate_limited`)"
            ),
        ),
    ] = 20.0
    ingest_node_burst: Annotated[
        int, Meta(ge=1, le=1000000, description="messages one node may send in a burst")
    ] = 100
    http_host: Annotated[
        str, Meta(description="address the HTTP API listens on"), Option(aliases=("--host",))
    ] = "127.0.0.1"
    http_port: Annotated[
        Port,
        Meta(description="port of the HTTP API (0: any free port)"),
        Option(aliases=("--port",)),
    ] = 8080
    http_idle_timeout_s: Annotated[
        float,
        Meta(
            gt=0,
            le=3600,
            description=(
                "seconds a connection may stay without a complete request header (idle keep-alive "
                "and slow-header clients are closed)"
            ),
        ),
    ] = 15.0
    http_body_timeout_s: Annotated[
        float, Meta(gt=0, le=3600, description="seconds a request body may take to arrive")
    ] = 30.0
    metrics_token: Annotated[
        str | None,
        Meta(
            description=(
                "bearer token that reads `/metrics` (an operator API key always does); `/metrics` "
                "names every tenant's pools"
            )
        ),
    ] = None
    metrics_port: Annotated[
        Port | None,
        Meta(
            description=(
                "serve `/metrics` on a listener of its own at this port (not on the API port); "
                "open there unless `metrics_token` is set"
            )
        ),
    ] = None
    metrics_host: Annotated[
        str, Meta(description="address the `/metrics` listener binds (with `metrics_port`)")
    ] = "127.0.0.1"
    misses: Annotated[
        int,
        Meta(ge=1, le=100, description="missed heartbeat intervals before a node is unreachable"),
    ] = 3
    recovery_hold_s: Annotated[
        float,
        Meta(
            ge=0,
            le=3600,
            description="seconds of steady heartbeats before an unreachable node is back",
        ),
    ] = 10.0
    min_interval_s: Annotated[
        float,
        Meta(
            ge=0.1,
            le=3600,
            description=(
                "shortest heartbeat interval an agent is judged by (shorter ones are clamped up "
                "and counted)"
            ),
        ),
    ] = 0.2
    max_interval_s: Annotated[
        float,
        Meta(
            ge=0.1,
            le=3600,
            description=(
                "longest heartbeat interval an agent is judged by (longer ones are clamped down "
                "and counted)"
            ),
        ),
    ] = 300.0
    outage_fraction: Annotated[
        float,
        Meta(
            gt=0,
            le=1,
            description=(
                "a sweep that would mark more than this fraction of the reachable nodes "
                "unreachable at once is taken as the coordinator's own outage"
            ),
        ),
    ] = 0.5
    outage_min_nodes: Annotated[
        int,
        Meta(
            ge=1,
            description=(
                "the outage rule applies only when at least this many nodes would be marked at once"
            ),
        ),
    ] = 5
    flush_interval_s: Annotated[
        float, Meta(gt=0, le=60, description="seconds between writes of nodes' last-seen times")
    ] = 1.0
    sweep_interval_s: Annotated[
        float, Meta(gt=0, le=60, description="seconds between sweeps for missed heartbeats")
    ] = 0.5
    rebuild_interval_s: Annotated[
        float,
        Meta(gt=0, le=3600, description="seconds between full rebuilds of the capacity rollup"),
    ] = 10.0
    reservation_tick_s: Annotated[
        float, Meta(gt=0, le=60, description="seconds between reservation clock ticks")
    ] = 1.0
    use_interval_s: Annotated[
        float,
        Meta(
            gt=0,
            le=60,
            description="seconds between passes that join GPU use with bookings and account it",
        ),
    ] = 5.0
    use_flush_s: Annotated[
        float,
        Meta(
            ge=0,
            le=3600,
            description=(
                "seconds between writes of accrued GPU use to the ledger (a leader that"
                " dies loses at most this much accounting; 0: every pass)"
            ),
        ),
    ] = 60.0
    idle_after_s: Annotated[
        float,
        Meta(
            ge=0,
            le=30 * 86400,
            description=(
                "seconds a live reservation's GPUs must be idle (no process, or SM"
                " utilization under `idle_util_percent`) before `reservation.idle`"
            ),
        ),
    ] = 1800.0
    idle_util_percent: Annotated[
        int,
        Meta(
            ge=0,
            le=100,
            description="SM utilization (%) under which a GPU counts as idle (set the"
            " agents' `idle_util_percent` alike)",
        ),
    ] = IDLE_UTIL_PERCENT
    notice_s: Annotated[
        float, Meta(ge=0, le=86400, description="notice a preempted spot reservation gets, seconds")
    ] = 120.0
    idempotency_keep_s: Annotated[
        float,
        Meta(
            ge=86400,
            description="seconds an idempotency record is kept (the SPEC promises at least 24 h)",
        ),
    ] = 86400.0
    idempotency_purge_interval_s: Annotated[
        float, Meta(gt=0, le=86400, description="seconds between purges of old idempotency records")
    ] = 600.0
    heap_refresh_s: Annotated[
        float,
        Meta(
            ge=0,
            le=86400,
            description=(
                "after a pool's cache is reloaded its objects are frozen out of the garbage "
                "collector's full pass; at most this many seconds apart the heap is unfrozen and "
                "collected whole, freeing what died among them (0: freeze nothing)"
            ),
        ),
    ] = 300.0
    alert_stream_max_msgs: Annotated[
        int, Meta(ge=1, description="alerts kept in the JetStream stream")
    ] = 100000
    alert_stream_max_age_s: Annotated[
        float, Meta(gt=0, description="seconds an alert is kept in the JetStream stream")
    ] = 7 * 86400
    alert_stream_replicas: Annotated[
        Annotated[int, Meta(ge=1, le=5)] | None,
        Meta(
            description=(
                "copies of the alert stream the cluster keeps; checked and corrected at start"
            )
        ),
        Option(default_doc="3 on a cluster of 3+ JetStream servers, else 1"),
    ] = None
    outbox_interval_s: Annotated[
        float,
        Meta(
            gt=0, le=60, description="seconds between looks at the alert outbox for unsent alerts"
        ),
    ] = 0.1
    alert_publish_timeout_s: Annotated[
        float,
        Meta(
            gt=0,
            le=60,
            description="seconds to wait for JetStream to acknowledge an alert before trying again",
        ),
    ] = 2.0
    bootstrap_operator_key: Annotated[
        str | None, Meta(description="an operator API key accepted at start (`gpufleet new-key`)")
    ] = None
    log_level: LogLevel = "INFO"
    log_format: Annotated[
        Literal["text", "json"],
        Meta(
            description=(
                "`json`: one JSON object per line (access and audit lines keep their fields)"
            )
        ),
    ] = "text"

    def check(self) -> None:
        if self.min_interval_s > self.max_interval_s:
            raise ConfigError("min_interval_s", "must not exceed max_interval_s")

    @classmethod
    def environment_extras(cls, env: Mapping[str, str]) -> dict[str, Any]:
        # systemd's StateDirectory= says where to keep the SQLite file.
        if "STATE_DIRECTORY" in env:
            return {"state_dir": env["STATE_DIRECTORY"].split(":")[0]}
        return {}

    @property
    def effective_database_url(self) -> str:
        return self.database_url or default_database_url(self.state_dir)


DOC_TABLE = DocTable(CoordinatorSettings, "settings", "coordinator.config", "docs/operator.md")


if __name__ == "__main__":
    DOC_TABLE.main()
