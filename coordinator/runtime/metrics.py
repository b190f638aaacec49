"""Prometheus metrics of the coordinator, in its own registry (one per process).

Naming follows Prometheus practice: one unit per metric (`_gpus`, `_bytes`, `_seconds`),
counters end in `_total`, and a family's label values are parts that add up, never a
total beside its parts, so `sum()` is always right. Per-GPU and per-node series are info
or state-set style (value 1) and join with dcgm-exporter on `UUID` and `Hostname`.
Cardinality is bounded by the fleet itself; docs/operator.md has the table.

Most values are read at scrape time from the objects that own them (ingest counters,
the liveness tracker, the ledger's census), so nothing on the hot path pays for metrics
except the API latency histogram and the booking counters.

Replicas: series that describe the fleet (the census, heartbeat ages, the alert outbox)
are the same whichever replica reads them, so only the leader exports them (in every
scrape it answers while it leads); every replica exports its process series (what it
ingested, served, published, its links, `gpufleet_leader`). Scraping all replicas and
summing is then right without any dedup, and a new leader takes the fleet series over.
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from coordinator.domain.census import Census
from coordinator.domain.consumption import Consumption
from coordinator.domain.gpu_use_conditions import IdleLine
from coordinator.domain.gpu_use_units import UnitLine, first_name
from coordinator.domain.intervals import INTERVAL_MS
from coordinator.domain.model import NODE_STATUSES, RollupRow
from procs.build import revision
from procs.version import __version__
from shared.counts import COUNT_COLUMNS
from shared.wire import ALERT_KINDS

# `*_created` series double every counter and histogram and say nothing a scraper needs.
prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
GIB = 1 << 30

# Per resource of the rollup: the metric's name and the factor to its base unit.
POOL_METRICS: dict[str, tuple[str, int, str]] = {
    "gpu": ("gpufleet_pool_gpus", 1, "Whole GPUs"),
    "gpu.mig": ("gpufleet_pool_mig_instances", 1, "MIG instances"),
    "gpu.slot": ("gpufleet_pool_gpu_slots", 1, "Shared-GPU slots"),
    "nic.vf": ("gpufleet_pool_nic_vfs", 1, "NIC virtual functions"),
    "disk": ("gpufleet_pool_disks", 1, "Disks"),
    "node": ("gpufleet_pool_nodes", 1, "Nodes"),
    "vcpu": ("gpufleet_pool_vcpus", 1, "vCPUs"),
    "memoryGiB": ("gpufleet_pool_memory_bytes", GIB, "Host memory in bytes"),
    "hugepages1Gi": ("gpufleet_pool_hugepages_bytes", GIB, "1 GiB huge pages in bytes"),
}
# The parts a pool's units are split into; they add up to everything the pool has: the
# rollup's counts less `total` and `allocatable` (split into the first three).
POOL_STATES: tuple[str, ...] = COUNT_COLUMNS[2:]
HEARTBEAT_AGE_BUCKETS: tuple[float, ...] = (1, 2, 5, 10, 15, 30, 60, 120, 300, 900)


def pool_parts(row: RollupRow) -> dict[str, int]:
    """The row as parts that sum to `total`: booked units are counted inside the
    allocatable bucket; units booked on atoms that left it count in the bucket they are in."""
    allocated = min(row.allocated, row.allocatable)
    reserved = min(row.reserved, row.allocatable - allocated)
    return {
        "allocated": allocated,
        "reserved": reserved,
        "available": row.allocatable - allocated - reserved,
        "provisioning": row.provisioning,
        "unhealthy": row.unhealthy,
        "maintenance": row.maintenance,
        "unreachable": row.unreachable,
    }


# Read once: the build does not change while it runs.
_REVISION = revision()


@dataclass
class Sources:
    """Where the scrape-time values come from; filled in by the wiring."""

    accepted: Mapping[str, int] = field(default_factory=dict)
    dropped: Mapping[str, int] = field(default_factory=dict)
    heartbeat_ages_s: Callable[[], list[float]] = list
    drift_corrections: Callable[[], int] = lambda: 0
    alerts_published: Mapping[str, int] = field(default_factory=dict)
    loop_failures: Mapping[str, int] = field(default_factory=dict)
    nats_errors: Mapping[str, int] = field(default_factory=dict)
    nats_probe_failures: Callable[[], int] = lambda: 0
    nats_probe_late: Callable[[], int] = lambda: 0
    bus_connected: Callable[[], bool] = lambda: False
    is_leader: Callable[[], bool] = lambda: False
    outage_holds: Callable[[], int] = lambda: 0
    interval_clamped: Callable[[], int] = lambda: 0
    # (pool, node, count) of each agent whose last heartbeat reported NATS errors.
    agent_bus_errors: Callable[[], Iterable[tuple[str, str, int]]] = tuple
    # The alert outbox and leader fencing (see `_outbox`).
    outbox_backlog: Callable[[], int] = lambda: 0
    outbox_oldest_age_s: Callable[[], float] = lambda: 0.0
    alert_publish_failures: Callable[[], int] = lambda: 0
    fenced_refusals: Callable[[], int] = lambda: 0
    # Each GPU or MIG unit as the last use pass saw it (`services.gpu_use_watch`).
    gpu_use: Callable[[], Sequence[UnitLine]] = tuple
    # The reservations said idle and not in use since (`services.gpu_use_watch`).
    idle: Callable[[], Sequence[IdleLine]] = tuple


def _census(census: Census) -> Iterable[Metric]:
    info = GaugeMetricFamily(
        "gpufleet_pool_info",
        "A pool's name, owning tenant and GPU model (value 1); join on `pool`",
        labels=["pool", "name", "tenant", "gpu_model"],
    )
    for pool in census.pools:
        info.add_metric([pool.pool_id, pool.name, pool.owner, pool.gpu_model or ""], 1)
    yield info
    families = {
        resource: GaugeMetricFamily(name, f"{what} per pool and state", labels=["pool", "state"])
        for resource, (name, _, what) in POOL_METRICS.items()
    }
    for pool_id, rows in sorted(census.rollup.items()):
        for row in rows:
            if row.resource not in POOL_METRICS:
                continue
            factor = POOL_METRICS[row.resource][1]
            for state, n in pool_parts(row).items():
                families[row.resource].add_metric([pool_id, state], n * factor)
    yield from families.values()
    node_info = GaugeMetricFamily(
        "gpufleet_node_info", "A node's hostname and pool (value 1)",
        labels=["node", "Hostname", "pool"],
    )  # fmt: skip
    node_state = GaugeMetricFamily(
        "gpufleet_node_state", "1 for the state the node is in, 0 for the others",
        labels=["node", "pool", "state"],
    )  # fmt: skip
    for node in census.nodes:
        node_info.add_metric([node.node_id, node.hostname, node.pool_id], 1)
        for state in NODE_STATUSES:
            node_state.add_metric([node.node_id, node.pool_id, state], int(state == node.status))
    yield node_info
    yield node_state
    gpu = GaugeMetricFamily(
        "gpufleet_gpu_info",
        "One whole GPU (value 1): its NVML UUID and hostname as dcgm-exporter labels them,"
        " its pool, its state and the reservation and tenant holding it now",
        labels=["UUID", "Hostname", "node", "pool", "state", "tenant", "reservation"],
    )
    for g in census.gpus:
        holder = g.holder
        gpu.add_metric(
            [
                g.uuid, g.hostname, g.node_id, g.pool_id, g.state,
                holder.tenant_id if holder else "", holder.reservation_id if holder else "",
            ],
            1,
        )  # fmt: skip
    yield gpu


def user_match(line: UnitLine, owner: str, kind: str) -> str:
    """How a process's owner stands to the unit's holders, as `gpu.foreignUse` judges
    it: `holder` (its reservation holds the unit), `foreign` (anyone else's: another
    reservation, a pod, job, unit or container, or nobody), `unbooked` (nobody holds
    the unit)."""
    if not line.holders:
        return "unbooked"
    return "holder" if kind == "reservation" and owner in line.holders else "foreign"


def _use(lines: Sequence[UnitLine]) -> Iterable[Metric]:
    """Per GPU (or MIG instance) UUID, joinable with dcgm-exporter's `UUID`."""
    in_use = GaugeMetricFamily(
        "gpufleet_gpu_in_use",
        "1 while a compute process runs on the GPU or MIG instance (`UUID`), 0 when none",
        labels=["UUID", "node", "pool"],
    )
    util = GaugeMetricFamily(
        "gpufleet_gpu_utilization_ratio",
        "SM utilization the agent last reported (0-1); absent where NVML cannot say",
        labels=["UUID", "node", "pool"],
    )
    users = GaugeMetricFamily(
        "gpufleet_gpu_user_info",
        "Who holds and who uses a GPU (value 1): one series per owner of its processes"
        " (`user` empty when none runs), `user_name` its readable name where known;"
        " `reservation` the holders, comma-separated",
        labels=["UUID", "node", "pool", "reservation", "user", "user_kind", "user_name", "match"],
    )
    for line in lines:
        base = [line.uuid, line.node_id, line.pool_id]
        in_use.add_metric(base, int(line.in_use))
        if line.sm_util is not None:
            util.add_metric(base, line.sm_util / 100)
        holders = ",".join(line.holders)
        # Still one series per owner (the join bounds a unit's owners): its processes may
        # name it differently, or not at all; `first_name` picks one, always the same.
        names: dict[tuple[str, str], list[str]] = {}
        for owner, kind, name in zip(line.users, line.owner_kinds, line.owner_names, strict=True):
            names.setdefault((owner, kind), []).append(name)
        if not names:
            users.add_metric([*base, holders, "", "", "", "idle"], 1)
        for (owner, kind), named in sorted(names.items()):
            match = user_match(line, owner, kind)
            users.add_metric([*base, holders, owner, kind, first_name(named), match], 1)
    yield in_use
    yield util
    yield users


def _idle(lines: Sequence[IdleLine]) -> Metric:
    idle = GaugeMetricFamily(
        "gpufleet_reservation_idle_since_seconds",
        "When a reservation said idle (`reservation.idle`) became idle, in Unix seconds:"
        " one series per idle reservation, gone when it works again or ends",
        labels=["reservation", "tenant", "pool", "node"],
    )
    for line in lines:
        idle.add_metric(
            [line.reservation_id, line.tenant_id, line.pool_id, line.node_id], line.since / 1000
        )
    return idle


def _buckets(ages: list[float]) -> list[tuple[str, float]]:
    out = [(str(float(le)), float(sum(1 for a in ages if a <= le))) for le in HEARTBEAT_AGE_BUCKETS]
    return [*out, ("+Inf", float(len(ages)))]


def _held_bytes(mib_ms: int) -> float:
    """A quarter's MiB-ms as the bytes held on average over it (one correctly rounded
    division: whole bytes stay whole)."""
    return (mib_ms << 20) / INTERVAL_MS


def _memory(rows: Iterable[Consumption]) -> Iterable[Metric]:
    """Chargeback (issue 35): the last complete interval's memory commitments, split
    into the part use consumed and the part it did not (they add up to what was
    reserved), and the use above them on demand; time-weighted bytes, per pool and
    tenant (`tenant` "" on demand: use no tenant owns)."""
    committed = GaugeMetricFamily(
        "gpufleet_memory_commitment_bytes",
        "Interval-reserved GPU memory in the last complete 15-minute interval, time-weighted,"
        " by what use made of it (state: used, unused)",
        labels=["pool", "tenant", "state"],
    )
    on_demand = GaugeMetricFamily(
        "gpufleet_memory_on_demand_bytes",
        "GPU memory used above any interval reservation in the last complete 15-minute"
        " interval, time-weighted (tenant empty: unattributed use)",
        labels=["pool", "tenant"],
    )
    for c in rows:
        if c.reserved:
            committed.add_metric([c.pool_id, c.tenant_id, "used"], _held_bytes(c.covered))
            committed.add_metric([c.pool_id, c.tenant_id, "unused"], _held_bytes(c.unused))
        if c.on_demand:
            on_demand.add_metric([c.pool_id, c.tenant_id], _held_bytes(c.on_demand))
    yield committed
    yield on_demand


def _fleet(census: Census, s: Sources) -> Iterable[Metric]:
    """The leader's series: what the fleet is, not what this process did."""
    yield from _census(census)
    yield from _memory(census.memory)
    yield from _use(s.gpu_use())
    yield _idle(s.idle())
    ages = s.heartbeat_ages_s()
    yield GaugeHistogramMetricFamily(
        "gpufleet_heartbeat_age_seconds",
        "Age of each node's newest heartbeat at scrape time, across the fleet",
        buckets=_buckets(ages),
        gsum_value=sum(ages),
    )
    yield GaugeMetricFamily(
        "gpufleet_alert_outbox_backlog",
        "Alerts in the outbox not yet acknowledged by JetStream",
        value=s.outbox_backlog(),
    )
    yield GaugeMetricFamily(
        "gpufleet_alert_outbox_oldest_age_seconds",
        "Age of the oldest alert not yet acknowledged by JetStream (0: none)",
        value=s.outbox_oldest_age_s(),
    )
    # Every replica hears every heartbeat: from the leader alone, like the fleet.
    agents = CounterMetricFamily(
        "gpufleet_agent_bus_errors",
        "NATS errors an agent reported in its last heartbeat, cumulative since it started"
        " (publishes refused or failed, permission violations); agents reporting none have"
        " no series",
        labels=["node", "pool"],
    )
    for pool, node, n in sorted(s.agent_bus_errors()):
        agents.add_metric([node, pool], n)
    yield agents


class _Collector(Collector):
    def __init__(self, sources: Sources) -> None:
        self.sources = sources
        self.census: Census | None = None

    def collect(self) -> Iterable[Metric]:
        s = self.sources
        build = GaugeMetricFamily(
            "gpufleet_build_info", "The running coordinator's version (value 1)",
            labels=["version", "revision", "python_version"],
        )  # fmt: skip
        build.add_metric([__version__, _REVISION, platform.python_version()], 1)
        yield build
        if self.census is not None:
            yield from _fleet(self.census, s)
        ingest = CounterMetricFamily(
            "gpufleet_ingest_messages", "Agent messages accepted by kind", labels=["kind"]
        )
        for kind, n in sorted(s.accepted.items()):
            ingest.add_metric([kind], n)
        yield ingest
        dropped = CounterMetricFamily(
            "gpufleet_ingest_dropped", "Agent messages dropped by reason", labels=["reason"]
        )
        for reason, n in sorted(s.dropped.items()):
            dropped.add_metric([reason], n)
        yield dropped
        yield CounterMetricFamily(
            "gpufleet_rollup_drift_corrections",
            "Rollup rows the periodic rebuild had to correct",
            value=s.drift_corrections(),
        )
        alerts = CounterMetricFamily(
            "gpufleet_alerts_published", "Alerts published on NATS by kind", labels=["kind"]
        )
        for kind in ALERT_KINDS:
            alerts.add_metric([kind], s.alerts_published.get(kind, 0))
        yield alerts
        failures = CounterMetricFamily(
            "gpufleet_loop_failures", "Failed iterations of background loops", labels=["loop"]
        )
        for loop, n in sorted(s.loop_failures.items()):
            failures.add_metric([loop], n)
        yield failures
        yield GaugeMetricFamily(
            "gpufleet_leader",
            "1 while this replica holds the leadership (writes state, publishes alerts)",
            value=1 if s.is_leader() else 0,
        )
        yield from _liveness(s)
        yield from _outbox(s)


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
    yield CounterMetricFamily(
        "gpufleet_nats_probe_late",
        "NATS round-trip probes answered late while messages kept arriving (behind on"
        " reading: the link kept)",
        value=s.nats_probe_late(),
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


def _outbox(s: Sources) -> Iterable[Metric]:
    """This replica's failed alert publishes and refused leader writes."""
    yield CounterMetricFamily(
        "gpufleet_alert_publish_failures",
        "Alert publishes JetStream did not acknowledge in time (each retried)",
        value=s.alert_publish_failures(),
    )
    yield CounterMetricFamily(
        "gpufleet_leader_fenced_writes",
        "Leader writes refused because this replica had lost the leader lock or term",
        value=s.fenced_refusals(),
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
        self.bookings = Counter(
            "gpufleet_bookings", "Bookings made, by kind (reservation, interval)",
            ["kind"], registry=self.registry,
        )  # fmt: skip
        self.refusals = Counter(
            "gpufleet_booking_refusals",
            "Booking requests refused, by kind and reason (the error code, lower case)",
            ["kind", "reason"],
            registry=self.registry,
        )
        for kind in ("reservation", "interval"):
            self.bookings.labels(kind)

    @property
    def sources(self) -> Sources:
        return self._collector.sources

    def observe_api(self, method: str, code: int, seconds: float) -> None:
        self.api_latency.labels(method, str(code)).observe(seconds)

    def booked(self, kind: str) -> None:
        self.bookings.labels(kind).inc()

    def refused(self, kind: str, reason: str) -> None:
        self.refusals.labels(kind, reason.lower()).inc()

    def exports_fleet(self) -> bool:
        """Whether this replica's scrape carries the fleet series (it leads)."""
        return self.sources.is_leader()

    def render(self, census: Census | None = None) -> bytes:
        """The exposition; the fleet series only with a `census` (give one only when
        `exports_fleet`)."""
        self._collector.census = census
        return bytes(generate_latest(self.registry))
