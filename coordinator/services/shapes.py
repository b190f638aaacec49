"""Expected node shapes as operator workflows: set (or clear) the shape expected of a
pool's nodes or of a host profile version's, and accept a node held for exceeding one.
The ledger records an acceptance like any node change (its `node.provisioned` event and
alert in the outbox with it); one that ends a hold wakes waiting requests."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from coordinator.domain.errors import NotFound
from coordinator.domain.ports import AlertSink
from coordinator.domain.shapes import ExpectedShape
from coordinator.ledger import Ledger
from coordinator.services import alerting
from coordinator.services.capacity_signal import CapacitySignal
from coordinator.services.node_records import NodeOutcome, accept_shape, rejudge_shapes
from shared.clock import Clock


@dataclass(frozen=True, slots=True)
class Shapes:
    ledger: Ledger
    clock: Clock
    alerts: AlertSink
    capacity: CapacitySignal

    async def expect(
        self,
        pool_id: str | None,
        profile: tuple[str, int] | None,
        counts: Mapping[str, int],
        by: str,
    ) -> ExpectedShape:
        """Set the shape of a pool (NotFound for an unknown one) or of a profile version;
        empty counts clear it. The nodes it applies to are judged at once by their last
        inventories (held, or let go), and again at each inventory."""
        if pool_id is not None and await self.ledger.pools.get(pool_id) is None:
            raise NotFound(f"pool {pool_id} not found")
        profile_id, version = profile or ("", 0)
        now = self.clock.now_ms()
        shape = ExpectedShape(pool_id or "", profile_id, version, dict(counts), now, by)
        await self.ledger.shapes.set(shape)
        nodes = await self.ledger.nodes.shaped_by(pool_id or "", profile)
        changes = await rejudge_shapes(self.ledger, nodes, now) if nodes else []
        if changes:
            self.capacity.notify()
        await alerting.publish(self.alerts, changes, now)
        return shape

    async def accept(self, node_id: str, by: str) -> NodeOutcome:
        now = self.clock.now_ms()
        changes = await accept_shape(self.ledger, node_id, by, now)
        if changes.transitions:
            self.capacity.notify()
        await alerting.publish(self.alerts, [changes], now)
        return changes
