"""Which transitions become alerts, and how they look on the wire.

One explicit mapping: today every kind the ledger records is published (SPEC §4: a kind
the ledger can produce and no subscriber can receive is a bug). To hold a kind back,
take it out of `PUBLISHED` here, nowhere else.
"""

from __future__ import annotations

from collections.abc import Iterable

from coordinator.domain.ports import AlertSink
from coordinator.domain.risk import RiskChange
from coordinator.domain.transitions import Transition
from coordinator.services.node_changes import NodeChanges
from shared.ids import ulid
from shared.wire import ALERT_KINDS, Alert, AlertKind

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


async def publish(sink: AlertSink, changes: Iterable[NodeChanges], now: int) -> None:
    """Publish the alerts for what was recorded, in the order it happened."""
    for change in changes:
        for t in change.transitions:
            alert = alert_for(change.node_id, change.pool_id, t, now)
            if alert is not None:
                await sink.publish(alert)
        for r in change.risks:
            alert = risk_alert(r, now)
            if alert is not None:
                await sink.publish(alert)
