"""What a gpufleet alert means to Alertmanager, and which conditions are firing.

The forwarder owns event-derived alerts; the Prometheus rules own metric-derived ones,
and no alert name comes from both. Every name the forwarder produces is
`GpufleetEvent` + the kind in CamelCase (`node.unreachable` ->
`GpufleetEventNodeUnreachable`); the rules' names never start with `GpufleetEvent`.

A kind that starts a condition (`CONDITIONS`) fires an alert that stays firing, re-sent
every resend interval, until a kind that ends it (`ENDS`) arrives for the same labels.
Other kinds are one-shot: they fire once and end after the event TTL.

`Conditions` keeps, per label set, the latest transition and when it happened, so
applying the same alerts twice or out of order (the stream's history read at start,
then the durable consumer's redeliveries) ends in the same state.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from shared.wire import Alert

EVENT_PREFIX = "GpufleetEvent"
# An ended condition is remembered (to tell a stale replay from news) this long after
# its end: longer than the alert stream keeps anything (7 days), so no replay is older.
FORGET_ENDED_MS = 8 * 86_400_000
_PRUNE_EVERY = 1000

# kind -> severity of the condition it starts.
CONDITIONS: dict[str, str] = {
    "node.unreachable": "critical",
    "node.unhealthy": "critical",
    "node.unmonitored": "critical",
    "node.degraded": "warning",
    "device.unhealthy": "warning",
    "device.degraded": "warning",
    "device.missing": "warning",
    "node.maintenance": "info",
    "node.provisioning": "info",
    "reservation.atRisk": "warning",
    "reservation.idle": "info",
}
# kind -> the condition kinds it ends.
ENDS: dict[str, tuple[str, ...]] = {
    "node.reachable": ("node.unreachable",),
    "node.healthy": ("node.unhealthy", "node.unmonitored", "node.degraded"),
    "device.healthy": ("device.unhealthy", "device.degraded", "device.missing"),
    "node.maintenanceEnded": ("node.maintenance",),
    "node.provisioned": ("node.provisioning",),
    "reservation.recovered": ("reservation.atRisk",),
    "reservation.inUse": ("reservation.idle",),
}
# One-shot kinds more pressing than news (default `info`): a GPU used without, or
# against, its booking.
EVENT_SEVERITY: dict[str, str] = {
    "gpu.unbookedUse": "warning",
    "gpu.foreignUse": "warning",
}


def alert_name(kind: str) -> str:
    return EVENT_PREFIX + "".join(p[:1].upper() + p[1:] for p in kind.split("."))


def rfc3339(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


@dataclass(frozen=True)
class AmAlert:
    """One Alertmanager alert. `ends_ms` None: firing until resolved, so its `endsAt` is
    set when it is sent (now + the hold), as Prometheus does."""

    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    starts_ms: int
    ends_ms: int | None

    def key(self) -> tuple[tuple[str, str], ...]:
        return tuple(sorted(self.labels.items()))

    def resolved(self, now_ms: int) -> bool:
        return self.ends_ms is not None and self.ends_ms <= now_ms

    def api_v2(self, now_ms: int, hold_ms: int) -> dict[str, Any]:
        # max: a start ahead of this clock (skew) would otherwise end before it began.
        ends = max(now_ms, self.starts_ms) + hold_ms if self.ends_ms is None else self.ends_ms
        return {
            "labels": dict(self.labels),
            "annotations": dict(self.annotations),
            "startsAt": rfc3339(self.starts_ms),
            "endsAt": rfc3339(ends),
        }


@dataclass(frozen=True)
class Outcome:
    """What one alert means: `alertmanager`, the alerts to send there (empty when the
    alert is older than what is known about its conditions); `notified`, the alerts a
    webhook is told about; `status`, firing or resolved."""

    alertmanager: tuple[AmAlert, ...]
    notified: tuple[AmAlert, ...]
    status: str


@dataclass
class _State:
    at: int
    starts_ms: int
    firing: AmAlert | None  # None: ended at `at`


@dataclass
class Conditions:
    """The firing conditions, keyed by their labels."""

    labels: Mapping[str, str] = field(default_factory=dict)
    event_ttl_ms: int = 3_600_000
    _states: dict[tuple[tuple[str, str], ...], _State] = field(default_factory=dict)
    _applied: int = 0

    def firing(self) -> Iterator[AmAlert]:
        for state in self._states.values():
            if state.firing is not None:
                yield state.firing

    def __len__(self) -> int:
        return len(self._states)

    def _forget_ended(self, before_ms: int) -> None:
        """Ended conditions otherwise pile up (one per reservation ever at risk)."""
        self._states = {
            k: v for k, v in self._states.items() if v.firing is not None or v.at >= before_ms
        }

    def _base(self, alert: Alert) -> dict[str, str]:
        base = {"pool": alert.pool_id, "node": alert.node_id} | dict(self.labels)
        if alert.device_id:
            base["device"] = alert.device_id
        if alert.reservation_id:
            base["reservation"] = alert.reservation_id
        elif alert.kind == "gpu.foreignUse" and (kind := alert.details.get("ownerKind")):
            # A pod, job, container or unit (or nobody) on a booked GPU: its owner tells
            # two of them on one GPU apart, as a reservation's label does for its own.
            owner = alert.details.get("owner")
            base["owner"] = f"{kind}:{owner}" if owner else str(kind)
        return base

    @staticmethod
    def _annotations(alert: Alert) -> dict[str, str]:
        return {
            "summary": f"{alert.kind} on node {alert.node_id} (pool {alert.pool_id})",
            "description": alert.reason or alert.kind,
            "kind": alert.kind,
            "by": alert.by,
            "alertId": alert.alert_id,
        }

    def apply(self, alert: Alert) -> Outcome:
        self._applied += 1
        if self._applied % _PRUNE_EVERY == 0:
            self._forget_ended(before_ms=alert.at - FORGET_ENDED_MS)
        base = self._base(alert)
        annotations = self._annotations(alert)
        if alert.kind in ENDS:
            to_am: list[AmAlert] = []
            mapped: list[AmAlert] = []
            for kind in ENDS[alert.kind]:
                labels = base | {"alertname": alert_name(kind), "severity": CONDITIONS[kind]}
                ended = AmAlert(labels, annotations, alert.at, alert.at)
                state = self._states.get(ended.key())
                mapped.append(ended)
                if state is None or state.at > alert.at:
                    continue  # never fired as far as the stream tells, or a stale end
                if state.firing is None and state.at < alert.at:
                    continue  # ended before; nothing to tell Alertmanager again
                ended = AmAlert(labels, annotations, state.starts_ms, alert.at)
                self._states[ended.key()] = _State(alert.at, state.starts_ms, None)
                to_am.append(ended)
            return Outcome(tuple(to_am), tuple(to_am) or tuple(mapped), "resolved")
        if alert.kind in CONDITIONS:
            labels = base | {
                "alertname": alert_name(alert.kind), "severity": CONDITIONS[alert.kind]
            }  # fmt: skip
            fired = AmAlert(labels, annotations, alert.since or alert.at, None)
            state = self._states.get(fired.key())
            if state is not None and state.at > alert.at:
                return Outcome((), (fired,), "firing")
            if state is not None and state.firing is not None and state.at <= alert.at:
                # Still the same condition: it keeps its start.
                fired = AmAlert(labels, annotations, state.firing.starts_ms, None)
            self._states[fired.key()] = _State(alert.at, fired.starts_ms, fired)
            return Outcome((fired,), (fired,), "firing")
        severity = EVENT_SEVERITY.get(alert.kind, "info")
        labels = base | {"alertname": alert_name(alert.kind), "severity": severity}
        event = AmAlert(labels, annotations, alert.at, alert.at + self.event_ttl_ms)
        return Outcome((event,), (event,), "firing")
