"""The bridge's Prometheus metrics, in its own registry, served as text at `/metrics`
(the coordinator's content type) on a listener of its own when `metrics_port` is set.

Lag behind the ledger is the age of the newest ledger snapshot Slurm was made to match
in full; it grows while any action keeps failing or the coordinator or Slurm cannot be
read, and is what to alert on. Actions and failures are counted by kind."""

from __future__ import annotations

import time
from contextlib import AbstractAsyncContextManager

from prometheus_client import CollectorRegistry, Counter, Gauge

from ops.kit.metrics_endpoint import exposition, serving
from ops.slurm.bridge.model import ACTION_KINDS, GPU_TRES_MODES, MECHANISMS, GpuTres

# What can fail besides an action: reading the ledger, reading Slurm, reading its QOS.
READ_KINDS = ("ledger.read", "slurm.read", "qos.read")
# Who may refuse the bridge's credentials.
REFUSERS = ("nats", "coordinator")


class BridgeMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.actions = Counter(
            "gpufleet_slurm_bridge_actions_total", "Changes made in Slurm, by kind",
            ["kind"], registry=r,
        )  # fmt: skip
        self.failures = Counter(
            "gpufleet_slurm_bridge_failures_total",
            "Slurm actions refused or timed out, and failed reads of the ledger or Slurm",
            ["kind"], registry=r,
        )  # fmt: skip
        self.refused = Counter(
            "gpufleet_slurm_bridge_refused_total",
            "Requests refused for the bridge's credentials or permissions, by who refused "
            "(nats: its NATS user; coordinator: its API key)", ["by"], registry=r,
        )  # fmt: skip
        for by in REFUSERS:
            self.refused.labels(by)
        self.reconciles = Counter(
            "gpufleet_slurm_bridge_reconciles_total", "Ledger-to-Slurm passes", registry=r
        )
        self.events = Counter(
            "gpufleet_slurm_bridge_events_total", "Alert-stream events that triggered one",
            registry=r,
        )  # fmt: skip
        self.consumer_mismatches = Counter(
            "gpufleet_slurm_bridge_consumer_mismatches_total",
            "Times its alert-stream consumer was found changed behind its back (set back,"
            " or the bridge stops)", registry=r,
        )  # fmt: skip
        self.unknown_nodes = Gauge(
            "gpufleet_slurm_bridge_unknown_nodes",
            "Nodes the ledger wants reserved or drained that Slurm does not know", registry=r,
        )  # fmt: skip
        self.unmapped = Gauge(
            "gpufleet_slurm_bridge_unmapped_reservations",
            "Live reservations left out: no Slurm user or account for their tenant", registry=r,
        )  # fmt: skip
        self.left_alone = Gauge(
            "gpufleet_slurm_bridge_foreign_drains",
            "Nodes gpufleet would drain that someone else drained (left as they are)",
            registry=r,
        )  # fmt: skip
        self.gpu_tres_mode = Gauge(
            "gpufleet_slurm_bridge_gpu_tres_mode",
            "1 for how GPUs are reserved now (typed, count, off: whole nodes); `auto` "
            "shows typed until Slurm refuses GPU TRES, then off", ["mode"], registry=r,
        )  # fmt: skip
        self.mechanism = Gauge(
            "gpufleet_slurm_bridge_mechanism",
            "1 for how bookings are held now: the reservation (gres: GPU TRES, cores: "
            "the GPUs' cores, nodes: whole nodes), +qos where each booking's QOS caps its "
            "jobs", ["mechanism"], registry=r,
        )  # fmt: skip
        self.synced_at = 0.0  # epoch seconds of the ledger snapshot last matched in full
        lag = Gauge(
            "gpufleet_slurm_bridge_lag_seconds",
            "Age of the newest ledger snapshot Slurm was made to match in full", registry=r,
        )  # fmt: skip
        lag.set_function(lambda: time.time() - self.synced_at if self.synced_at else float("nan"))
        for kind in (*ACTION_KINDS, *READ_KINDS):
            self.failures.labels(kind)
        for kind in ACTION_KINDS:
            self.actions.labels(kind)

    def set_gpu_tres_mode(self, mode: GpuTres) -> None:
        for m in GPU_TRES_MODES:
            self.gpu_tres_mode.labels(m).set(1 if m == mode else 0)

    def set_mechanism(self, mechanism: str) -> None:
        for m in MECHANISMS:
            self.mechanism.labels(m).set(1 if m == mechanism else 0)

    def text(self) -> bytes:
        return exposition(self.registry)

    def serving(self, host: str, port: int) -> AbstractAsyncContextManager[int]:
        """`/metrics` on host:port (0: a free port) until the block ends; yields the port."""
        return serving(self.registry, host, port)
