"""Node maintenance as a workflow: an operator puts a node in or out of maintenance
with a reason. The ledger records the change (its atoms move bucket at once, a node
event is written, the reservations on it are at risk or recover); a change — not a
repeat — wakes waiting requests and is an alert, as is each reservation's change."""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.domain.ports import AlertSink
from coordinator.ledger import Ledger
from coordinator.services import alerting
from coordinator.services.capacity_signal import CapacitySignal
from coordinator.services.node_records import record_maintenance
from shared.clock import Clock


@dataclass(frozen=True, slots=True)
class MaintenanceSet:
    node_id: str
    pool_id: str
    maintenance: bool
    changed: bool  # False when the node already was in the state asked for
    at: int
    reservations_at_risk: int = 0  # reservations this change put at risk


@dataclass(frozen=True, slots=True)
class Maintenance:
    ledger: Ledger
    clock: Clock
    alerts: AlertSink
    capacity: CapacitySignal

    async def set(self, node_id: str, on: bool, reason: str, by: str) -> MaintenanceSet:
        now = self.clock.now_ms()
        changes = await record_maintenance(self.ledger, node_id, on, reason, by, now)
        if changes.transitions:
            # A node back from maintenance may be what a waiting request needs.
            self.capacity.notify()
        await alerting.publish(self.alerts, [changes], now)
        return MaintenanceSet(
            node_id, changes.pool_id, on, bool(changes.transitions), now, changes.put_at_risk
        )
