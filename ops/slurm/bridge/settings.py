"""The Slurm bridge's settings: one frozen model, read as every gpufleet daemon's are
(`procs.settings`): the `[slurm_bridge]` table (or top-level keys) of the TOML file
named by `--config` or `GPUFLEET_SLURM_BRIDGE_CONFIG`, then `GPUFLEET_*` env, then
flags. Its flags and the table in docs/operator.md are generated from it.

`python -m ops.slurm.bridge.settings docs/operator.md` rewrites that table; a test
fails when the doc and the model disagree.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from ops.kit.client import InsecureHttp, require_tls
from ops.slurm.bridge.model import DRAIN_CAUSES, BookingQosSetting, DrainCause, GpuTresSetting
from ops.slurm.bridge.planner import UNREACHABLE_GRACE_S, Policy
from procs.logs import LogLevel
from procs.nats import ProbedNatsSettings
from procs.settings import ConfigError, DocTable, Option, SettingsModel

__all__ = ["BridgeSettings"]

Seconds = Annotated[float, Meta(gt=0, le=86400)]


def _pair(text: str) -> dict[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"{text!r} is not KEY=VALUE")
    return {key.strip(): value.strip()}


def _names(text: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in text.split(",") if n.strip())


class BridgeSettings(SettingsModel, frozen=True):
    prog = "gpufleet-slurm-bridge"
    summary = "Keep Slurm's reservations and drains in step with the gpufleet ledger."
    toml_table = "slurm_bridge"
    config_env = "GPUFLEET_SLURM_BRIDGE_CONFIG"

    coordinator_url: Annotated[
        str, Meta(description="the coordinator's HTTP API (a load balancer over replicas)")
    ] = "http://127.0.0.1:8080"
    insecure_http: Annotated[
        bool, Meta(description="allow plain http:// to a coordinator off this machine")
    ] = False
    coordinator_key: Annotated[
        str,
        Meta(
            description="an observer API key (read-only, every tenant: `gpufleet key-create"
            " TENANT --role observer`; secret: give it in the environment)"
        ),
        Option(env="GPUFLEET_SLURM_BRIDGE_KEY", default_doc="none (required)"),
    ] = ""
    # Its credentials: `gpufleet nats-auth --forwarder DURABLE`.
    nats: ProbedNatsSettings = msgspec.field(default_factory=ProbedNatsSettings)
    durable: Annotated[
        str,
        Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$",
             description="name of its durable JetStream consumer on the alert stream"),
    ] = "slurm-bridge"  # fmt: skip
    accounts: Annotated[
        dict[str, str],
        Meta(description="tenant -> Slurm account(s), comma-separated (`[slurm_bridge.accounts]`)"),
        Option(flag="--account", metavar="TENANT=ACCOUNT", item=_pair),
    ] = msgspec.field(default_factory=dict)
    users: Annotated[
        dict[str, str],
        Meta(description="tenant -> Slurm user(s), comma-separated (`[slurm_bridge.users]`)"),
        Option(flag="--user", metavar="TENANT=USERS", item=_pair),
    ] = msgspec.field(default_factory=dict)
    default_account: Annotated[
        str,
        Meta(description="account(s) for a tenant with no mapping"),
        Option(default_doc="none"),
    ] = ""
    default_users: Annotated[
        str,
        Meta(description="user(s) for a tenant with no mapping"),
        Option(default_doc="none"),
    ] = ""
    gpu_tres: Annotated[
        GpuTresSetting,
        Meta(description=(
            "how a booking's GPUs are reserved: `typed` TRES=gres/gpu:<type>=n and `count` "
            "gres/gpu=n (Slurm 23.11+ with slurmdbd), `cores` the GPUs' cores (before 23.11: "
            "`slurm conf --socket-per-gpu` and job_submit.lua), `off` whole nodes; `auto` "
            "as `typed` until Slurm refuses GRES in reservations, then `cores` (where nodes "
            "have a socket per GPU) or `off`"
        )),
    ] = "auto"  # fmt: skip
    booking_qos: Annotated[
        BookingQosSetting,
        Meta(description=(
            "a QOS per booking, `gpufleet-<id>` with `GrpTRES=` its GPUs, allowed to its "
            "users and accounts, so its jobs together hold no more than booked (with "
            "job_submit.lua's BOOKING_QOS); `auto`: wherever sacctmgr reaches slurmdbd"
        )),
    ] = "auto"  # fmt: skip
    node_names: Annotated[
        dict[str, str],
        Meta(description="gpufleet node id -> Slurm node name, where they differ"),
        Option(flag="--node-name", metavar="NODE=SLURMNODE", item=_pair),
    ] = msgspec.field(default_factory=dict)
    drain_on: Annotated[
        tuple[DrainCause, ...],
        Meta(
            description=("node states drained in Slurm (`unhealthy`: the node, or any of its GPUs)")
        ),
        Option(metavar="CAUSE", item=str, default_doc="`maintenance,unhealthy,unreachable`"),
    ] = DRAIN_CAUSES
    unreachable_grace_s: Annotated[
        float,
        Meta(ge=0, le=86400, description=(
            "seconds a node stays unreachable before it is drained (longer than an agent "
            "restart, so a rolling upgrade drains nothing)"
        )),
    ] = UNREACHABLE_GRACE_S  # fmt: skip
    pools: Annotated[
        tuple[str, ...],
        Meta(description="pools followed (empty: every pool)"),
        Option(flag="--pool", metavar="POOL", item=str),
    ] = ()
    scontrol: Annotated[str, Meta(min_length=1, description="the scontrol program")] = "scontrol"
    sacctmgr: Annotated[str, Meta(min_length=1, description="the sacctmgr program")] = "sacctmgr"
    slurm_conf: Annotated[
        str | None, Meta(description="SLURM_CONF for scontrol (default: Slurm's own)")
    ] = None
    scontrol_timeout_s: Annotated[Seconds, Meta(description="seconds per scontrol call")] = 10.0
    resync_interval_s: Annotated[
        Seconds,
        Meta(description=(
            "the ledger is re-read this often without an event (bookings, renewals and "
            "releases publish none)"
        )),
    ] = 5.0  # fmt: skip
    http_timeout_s: Annotated[Seconds, Meta(description="seconds per coordinator call")] = 10.0
    fetch_wait_s: Annotated[
        float, Meta(gt=0, le=60, description="seconds one pull waits for new events")
    ] = 1.0
    metrics_host: Annotated[str, Meta(description="address of the /metrics listener")] = "127.0.0.1"
    metrics_port: Annotated[
        Annotated[int, Meta(ge=0, le=65535)] | None,
        Meta(description="port of /metrics (unset: none; 0: any free one)"),
    ] = None
    log_level: LogLevel = "INFO"

    def check(self) -> None:
        if not self.coordinator_url.startswith(("http://", "https://")):
            raise ConfigError("coordinator_url", "must be an http(s) URL")
        try:
            require_tls(self.coordinator_url, self.insecure_http)
        except InsecureHttp as exc:
            raise ConfigError("coordinator_url", str(exc)) from None
        if not self.coordinator_key:
            raise ConfigError("coordinator_key", "an observer key is required "
                              "(GPUFLEET_SLURM_BRIDGE_KEY)")  # fmt: skip

    def policy(self) -> Policy:
        return Policy(
            accounts={t: _names(a) for t, a in self.accounts.items()},
            users={t: _names(u) for t, u in self.users.items()},
            default_accounts=_names(self.default_account),
            default_users=_names(self.default_users),
            gpu_tres="typed" if self.gpu_tres == "auto" else self.gpu_tres,
            node_names=dict(self.node_names),
            drain_on=frozenset(self.drain_on),
            pools=frozenset(self.pools),
            unreachable_grace_s=self.unreachable_grace_s,
        )


DOC_TABLE = DocTable(
    BridgeSettings, "slurm-bridge-settings", "ops.slurm.bridge.settings", "docs/operator.md"
)


if __name__ == "__main__":
    DOC_TABLE.main()
