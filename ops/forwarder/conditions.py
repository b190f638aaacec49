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
    # Use is a condition too (issue 34): firing while it lasts, re-sent until it ends.
    "gpu.unbookedUse": "warning",
    "gpu.foreignUse": "warning",
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
    "gpu.unbookedUseEnded": ("gpu.unbookedUse",),
    "gpu.foreignUseEnded": ("gpu.foreignUse",),
}
# Use kinds a coordinator before issue 34 said as one-shot events (no `details.ends`):
# still in the stream's history after an upgrade, they must not fire for good.
ONE_SHOT_BEFORE: dict[str, str] = {"gpu.unbookedUse": "warning", "gpu.foreignUse": "warning"}
# One-shot kinds more pressing than news (default `info`).
EVENT_SEVERITY: dict[str, str] = {}
# A reservation at risk for a fault of what it holds (an XID taking its GPU, its node
# lost) pages: docs/operator.md tells operators to route on `severity`.
PAGING_RISKS = frozenset({"unhealthy", "unreachable"})
# Labels that tell the operator more but not which condition it is: an end resolves the
# condition it matches on the others, whatever these said when it fired (a foreign
# use's holders, and so its tenant, may have changed by its end).
INFO_LABELS = frozenset({"severity", "tenant", "pool_name", "owner_kind", "owner_name"})


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
        """Which condition it is: its labels but the informational ones."""
        return tuple(sorted((k, v) for k, v in self.labels.items() if k not in INFO_LABELS))

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
        elif alert.kind.startswith("gpu.foreignUse") and (kind := alert.details.get("ownerKind")):
            # A pod, job, container or unit (or nobody) on a booked GPU: its owner tells
            # two of them on one GPU apart, as a reservation's label does for its own.
            owner = alert.details.get("owner")
            base["owner"] = f"{kind}:{owner}" if owner else str(kind)
        return base | _info(alert)

    @staticmethod
    def _severity(alert: Alert, kind: str) -> str:
        if kind == "reservation.atRisk" and alert.details.get("reason") in PAGING_RISKS:
            return "critical"
        return CONDITIONS[kind]

    @staticmethod
    def _annotations(alert: Alert) -> dict[str, str]:
        return {
            "summary": f"{alert.kind} on node {alert.node_id}"
            f" (pool {alert.details.get('poolName') or alert.pool_id})",
            "description": _described(alert),
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
                if state.firing is not None:
                    # Alertmanager resolves the label set it was sent.
                    labels = dict(state.firing.labels)
                ended = AmAlert(labels, annotations, state.starts_ms, alert.at)
                self._states[ended.key()] = _State(alert.at, state.starts_ms, None)
                to_am.append(ended)
            return Outcome(tuple(to_am), tuple(to_am) or tuple(mapped), "resolved")
        legacy = alert.kind in ONE_SHOT_BEFORE and "ends" not in alert.details
        if alert.kind in CONDITIONS and not legacy:
            labels = base | {
                "alertname": alert_name(alert.kind), "severity": self._severity(alert, alert.kind)
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
        severity = ONE_SHOT_BEFORE.get(alert.kind) or EVENT_SEVERITY.get(alert.kind, "info")
        labels = base | {"alertname": alert_name(alert.kind), "severity": severity}
        event = AmAlert(labels, annotations, alert.at, alert.at + self.event_ttl_ms)
        return Outcome((event,), (event,), "firing")


def _info(alert: Alert) -> dict[str, str]:
    """Who it concerns, to route on: the pool's name (`pool_name`), `tenant` (a
    reservation's, or the tenants holding a GPU used against its booking), and for use
    the owner's kind (`owner_kind`) and its readable name where the agent read one
    (`owner_name`, e.g. `pod:ml/train-0`, `slurm:alice`; on a GPU nobody booked, the
    first process's owner, its id where it has no name)."""
    d = alert.details
    out: dict[str, str] = {}
    if isinstance(d.get("poolName"), str):
        out["pool_name"] = d["poolName"]
    tenants = d.get("holderTenantIds")
    if isinstance(d.get("tenantId"), str) and d["tenantId"]:
        out["tenant"] = d["tenantId"]
    elif isinstance(tenants, list) and tenants:
        out["tenant"] = ",".join(str(t) for t in tenants)
    if alert.kind.startswith("gpu.foreignUse") and d.get("ownerKind"):
        out["owner_kind"] = str(d["ownerKind"])
        if d.get("ownerName"):
            out["owner_name"] = f"{d['ownerKind']}:{d['ownerName']}"
    owners = d.get("owners")
    if alert.kind == "gpu.unbookedUse" and isinstance(owners, list) and owners:
        first = owners[0] if isinstance(owners[0], dict) else {}
        kinds = sorted({str(o.get("ownerKind", "")) for o in owners if isinstance(o, dict)})
        out["owner_kind"] = ",".join(k for k in kinds if k)
        name = str(first.get("ownerName") or first.get("owner", ""))
        out["owner_name"] = f"{first.get('ownerKind', '')}:{name}" if name else "unknown"
    return {k: v for k, v in out.items() if v}


def _described(alert: Alert) -> str:
    """The reason, and for use the processes and their owners (`details.owners`)."""
    text = alert.reason or alert.kind
    owners = alert.details.get("owners")
    if isinstance(owners, list) and owners:
        procs = [
            f"pid {o.get('pid')} ({o.get('ownerKind', 'unknown')}"
            f" {o.get('ownerName') or o.get('owner') or '?'})"
            for o in owners[:8]
            if isinstance(o, dict)
        ]
        more = f" and {len(owners) - 8} more" if len(owners) > 8 else ""
        text = f"{text}: {', '.join(procs)}{more}"
    elif alert.kind.startswith("gpu.foreignUse") and alert.details.get("ownerKind"):
        pids = alert.details.get("pids")
        who = alert.details.get("ownerName") or alert.details.get("owner") or "?"
        owner = f"{alert.details['ownerKind']} {who}"
        text = f"{text} (owner {owner}" + (f", pids {pids})" if pids else ")")
    return text
