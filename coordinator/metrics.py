"""Prometheus metrics of the coordinator, in its own registry (one per process).

Most values are read at scrape time from the objects that own them (ingest counters,
the liveness tracker, the rollup), so nothing on the hot path pays for metrics except
the API latency histogram.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from coordinator.domain.model import BUCKETS, RollupRow

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass
class Sources:
    """Where the scrape-time values come from; filled in by the wiring."""

    accepted: Mapping[str, int] = field(default_factory=dict)
    dropped: Mapping[str, int] = field(default_factory=dict)
    heartbeat_ages_s: Callable[[], list[float]] = list
    drift_corrections: Callable[[], int] = lambda: 0
    alerts_published: Callable[[], int] = lambda: 0
    loop_failures: Mapping[str, int] = field(default_factory=dict)
    nats_errors: Mapping[str, int] = field(default_factory=dict)
    nats_probe_failures: Callable[[], int] = lambda: 0
    bus_connected: Callable[[], bool] = lambda: False
    outage_holds: Callable[[], int] = lambda: 0
    interval_clamped: Callable[[], int] = lambda: 0


class _Collector(Collector):
    def __init__(self, sources: Sources) -> None:
        self.sources = sources
        self.rollup: dict[str, list[RollupRow]] = {}

    def collect(self) -> Iterable[Metric]:
        s = self.sources
        rollup = GaugeMetricFamily(
            "gpufleet_rollup", "Atoms or units per pool, resource and bucket",
            labels=["pool", "resource", "bucket"],
        )  # fmt: skip
        for pool_id, rows in self.rollup.items():
            for row in rows:
                for column in ("total", *BUCKETS, "allocated", "reserved", "available"):
                    rollup.add_metric([pool_id, row.resource, column], getattr(row, column))
        yield rollup
        ingest = CounterMetricFamily(
            "gpufleet_ingest_messages", "Messages accepted by kind", labels=["kind"]
        )
        for kind, n in sorted(s.accepted.items()):
            ingest.add_metric([kind], n)
        yield ingest
        dropped = CounterMetricFamily(
            "gpufleet_ingest_dropped", "Messages dropped by reason", labels=["reason"]
        )
        for reason, n in sorted(s.dropped.items()):
            dropped.add_metric([reason], n)
        yield dropped
        ages = sorted(s.heartbeat_ages_s())
        age = GaugeMetricFamily(
            "gpufleet_heartbeat_age_seconds",
            "Age of the newest heartbeat per node: quantiles across nodes",
            labels=["quantile"],
        )
        if ages:
            for q in (0.5, 0.9, 0.99, 1.0):
                age.add_metric([str(q)], ages[min(len(ages) - 1, int(q * len(ages)))])
        yield age
        yield CounterMetricFamily(
            "gpufleet_rollup_drift_corrections",
            "Rollup rows the periodic rebuild had to correct",
            value=s.drift_corrections(),
        )
        yield CounterMetricFamily(
            "gpufleet_alerts_published", "Alerts published on NATS", value=s.alerts_published()
        )
        failures = CounterMetricFamily(
            "gpufleet_loop_failures", "Failed iterations of background loops", labels=["loop"]
        )
        for loop, n in sorted(s.loop_failures.items()):
            failures.add_metric([loop], n)
        yield failures
        yield from _liveness(s)


def _liveness(s: Sources) -> Iterable[Metric]:
    """The coordinator's own link and the liveness rules' safety valves."""
    errors = CounterMetricFamily(
        "gpufleet_nats_errors",
        "NATS client errors by kind: slow_consumer (messages dropped), authorization,"
        " permissions, other",
        labels=["kind"],
    )
    for kind, n in sorted(s.nats_errors.items()):
        errors.add_metric([kind], n)
    yield errors
    yield CounterMetricFamily(
        "gpufleet_nats_probe_failures",
        "NATS round-trip probes unanswered in time (link taken as dead)",
        value=s.nats_probe_failures(),
    )
    yield GaugeMetricFamily(
        "gpufleet_nats_connected",
        "1 while the coordinator is connected to NATS, 0 while it is cut off",
        value=1 if s.bus_connected() else 0,
    )
    yield CounterMetricFamily(
        "gpufleet_liveness_outage_holds",
        "Sweeps that would have marked a large fraction of the fleet unreachable at once,"
        " held as the coordinator's own outage",
        value=s.outage_holds(),
    )
    yield CounterMetricFamily(
        "gpufleet_heartbeat_interval_clamped",
        "Heartbeats whose announced interval was outside the accepted bounds",
        value=s.interval_clamped(),
    )


class Metrics:
    def __init__(self, sources: Sources | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._collector = _Collector(sources or Sources())
        self.registry.register(self._collector)
        self.api_latency = Histogram(
            "gpufleet_api_request_duration_seconds",
            "API latency by method and status code",
            ["method", "code"],
            registry=self.registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
        )

    @property
    def sources(self) -> Sources:
        return self._collector.sources

    def observe_api(self, method: str, code: int, seconds: float) -> None:
        self.api_latency.labels(method, str(code)).observe(seconds)

    def render(self, rollup: dict[str, list[RollupRow]]) -> bytes:
        self._collector.rollup = rollup
        return bytes(generate_latest(self.registry))
