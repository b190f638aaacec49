"""Which of two nodes that show the same physical devices is real (issue 31), as an
operator workflow: `replace` says NEW is the host OLD was — OLD's bookings that have not
ended move to NEW where it shows the same devices (or end, and the answer says which),
OLD is held as replaced and NEW's duplicate-device hold ends. To keep the node that was
there first, replace the newcomer by it. The change and its alerts are recorded like any
node change (`node_records.replace_node`); one that frees capacity wakes waiting
requests."""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.domain.ports import AlertSink
from coordinator.ledger import Ledger
from coordinator.services import alerting
from coordinator.services.capacity_signal import CapacitySignal
from coordinator.services.node_records import Replaced, replace_node
from shared.clock import Clock


@dataclass(frozen=True, slots=True)
class NodeIdentity:
    ledger: Ledger
    clock: Clock
    alerts: AlertSink
    capacity: CapacitySignal

    async def replace(self, old: str, new: str, by: str) -> Replaced:
        now = self.clock.now_ms()
        done = await replace_node(self.ledger, old, new, by, now)
        self.capacity.notify()
        await alerting.publish(self.alerts, [done.old, done.new], now)
        return done
