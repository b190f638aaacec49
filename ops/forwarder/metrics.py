"""The forwarder's Prometheus metrics, in its own registry, served as text at `/metrics`
on a listener of its own when `metrics_port` is set: what it delivered, refused and
dropped, in total and per target (`target` label: the URL, credentials redacted), each
target's queue depth and link state (1 while its last delivery went through), its NATS
link (up, and how often it was taken as dead), and how often its consumer on the alert
stream was found changed behind its back or missing (each a reason to look at who else
holds NATS credentials)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily, Metric

from ops.kit.metrics_endpoint import exposition, serving


@dataclass(frozen=True)
class TargetStat:
    """One target's figures as read at a scrape."""

    target: str
    delivered: int
    refused: int
    dropped: int
    queued: int
    up: bool


# name, help, field of TargetStat
_PER_TARGET = (
    ("gpufleet_alerts_target_delivered", "Alerts a target took", "delivered"),
    ("gpufleet_alerts_target_refused", "Deliveries a target refused (not retried)", "refused"),
    ("gpufleet_alerts_target_dropped", "Alerts dropped from a target's full queue", "dropped"),
    ("gpufleet_alerts_target_queue", "Alerts waiting for a target", "queued"),
    ("gpufleet_alerts_target_up", "1 while a target's last delivery went through", "up"),
)


class _Targets:
    """The per-target gauges, read from the forwarder at each scrape."""

    def __init__(self, read: Callable[[], Sequence[TargetStat]]) -> None:
        self._read = read

    def describe(self) -> Iterable[Metric]:
        return [GaugeMetricFamily(name, text, labels=["target"]) for name, text, _ in _PER_TARGET]

    def collect(self) -> Iterator[Metric]:
        stats = self._read()
        for name, text, attr in _PER_TARGET:
            family = GaugeMetricFamily(name, text, labels=["target"])
            for stat in stats:
                family.add_metric([stat.target], float(getattr(stat, attr)))
            yield family


class ForwarderMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.consumer_mismatches = Counter(
            "gpufleet_alerts_consumer_mismatches_total",
            "Times its alert-stream consumer was found changed behind its back (set back,"
            " or the forwarder stops)", registry=r,
        )  # fmt: skip

    def watch(self, name: str, help_text: str, read: Callable[[], float]) -> None:
        """A gauge read from the forwarder when scraped (its running totals)."""
        gauge = Gauge(name, help_text, registry=self.registry)
        gauge.set_function(read)

    def targets(self, read: Callable[[], Sequence[TargetStat]]) -> None:
        """Per-target gauges, read from `read` when scraped."""
        self.registry.register(_Targets(read))

    def text(self) -> bytes:
        return exposition(self.registry)

    def serving(self, host: str, port: int) -> AbstractAsyncContextManager[int]:
        """`/metrics` on host:port (0: a free port) until the block ends; yields the port."""
        return serving(self.registry, host, port)
