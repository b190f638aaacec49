"""Which transitions become alerts, and how they look on the wire.

One explicit mapping: today every kind the ledger records is published (SPEC §4: a kind
the ledger can produce and no subscriber can receive is a bug). To hold a kind back,
take it out of `PUBLISHED` here, nowhere else.

Alerts are made inside the unit of work that records their transitions and written to
the ledger's outbox with them (see `coordinator.services.node_records`); the outbox
relay (`coordinator.tasks.outbox_relay`) publishes them. `announce` tells the alert
sink of each, once committed: in the coordinator that wakes the relay, in tests it
records them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from coordinator.domain.ports import AlertSink
from coordinator.domain.risk import RiskChange
from coordinator.domain.transitions import Transition
from shared.ids import ulid
from shared.wire import ALERT_KINDS, Alert, AlertKind


class Committed(Protocol):
    """A change recorded with its alerts (`node_records.NodeOutcome`)."""

    @property
    def alerts(self) -> tuple[Alert, ...]: ...


PUBLISHED: frozenset[AlertKind] = frozenset(ALERT_KINDS)


def risk_alert(r: RiskChange, now: int) -> Alert | None:
    """To the holder (its tenant in the details) when a reservation becomes at risk or
    recovers."""
    kind: AlertKind = "reservation.atRisk" if r.at_risk is not None else "reservation.recovered"
    if kind not in PUBLISHED:
        return None
    risk = r.at_risk or r.before
    assert risk is not None
    details = {"tenantId": r.tenant_id, "reason": risk.reason, "atoms": list(risk.atoms)}
    return Alert(
        alert_id=ulid(now),
        kind=kind,
        pool_id=r.pool_id,
        node_id=r.node_id,
        at=now,
        reason=risk.reason if r.at_risk is not None else f"recovered from {risk.reason}",
        since=r.at_risk.since if r.at_risk is not None else now,
        reservation_id=r.reservation_id,
        details=details,
    )


def alert_for(node_id: str, pool_id: str, t: Transition, now: int) -> Alert | None:
    if t.kind not in PUBLISHED:
        return None
    return Alert(
        alert_id=ulid(now),
        kind=t.kind,
        pool_id=pool_id,
        node_id=node_id,
        at=now,
        reason=t.reason,
        since=now,
        by=t.by,
        device_id=t.device_id,
        details=t.details,
    )


def alerts_for(
    node_id: str, pool_id: str, transitions: Sequence[Transition], now: int
) -> tuple[Alert, ...]:
    """The alerts for one node's transitions, in the order they happened."""
    made = (alert_for(node_id, pool_id, t, now) for t in transitions)
    return tuple(a for a in made if a is not None)


def risk_alerts(risks: Sequence[RiskChange], now: int) -> tuple[Alert, ...]:
    """The alerts to the holders of reservations put at risk or recovered."""
    made = (risk_alert(r, now) for r in risks)
    return tuple(a for a in made if a is not None)


async def announce(sink: AlertSink, alerts: Iterable[Alert]) -> None:
    for alert in alerts:
        await sink.publish(alert)


async def publish(sink: AlertSink, changes: Iterable[Committed], now: int) -> None:
    """Announce the committed alerts of these changes, in the order they happened."""
    for change in changes:
        await announce(sink, change.alerts)
