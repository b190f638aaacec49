"""Node maintenance as a workflow: an operator puts a node in or out of maintenance
with a reason. The ledger records the change (its atoms move bucket at once, a node
event is written); a change — not a repeat — wakes waiting requests and is an alert."""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.capacity_signal import CapacitySignal
from coordinator.domain.clock import Clock
from coordinator.domain.ports import AlertSink
from coordinator.ledger import Ledger
from shared.ids import ulid
from shared.wire import Alert


@dataclass(frozen=True, slots=True)
class MaintenanceSet:
    node_id: str
    pool_id: str
    maintenance: bool
    changed: bool  # False when the node already was in the state asked for
    at: int


@dataclass(frozen=True, slots=True)
class Maintenance:
    ledger: Ledger
    clock: Clock
    alerts: AlertSink
    capacity: CapacitySignal

    async def set(self, node_id: str, on: bool, reason: str, by: str) -> MaintenanceSet:
        now = self.clock.now_ms()
        pool_id, changed = await self.ledger.nodes.set_maintenance(node_id, on, reason, by, now)
        if changed:
            # A node back from maintenance may be what a waiting request needs.
            self.capacity.notify()
            await self.alerts.publish(
                Alert(
                    alert_id=ulid(now),
                    kind="node.maintenance",
                    pool_id=pool_id,
                    node_id=node_id,
                    at=now,
                    reason=reason,
                    since=now,
                    by=by,
                    details={"maintenance": on},
                )
            )
        return MaintenanceSet(node_id, pool_id, on, changed, now)
