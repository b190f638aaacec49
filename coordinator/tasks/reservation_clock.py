"""What the clock does to reservations: leases that ran out expire, noticed spot
reservations become preempted, pools whose bookings started or ended get their
allocated/reserved columns refreshed (and their interval reservations' at-risk flags
judged again), and nodes held for a pool move whose last booking
has ended move — with no request in between."""

from __future__ import annotations

import logging

from coordinator.domain.ports import AlertSink
from coordinator.ledger import Ledger
from coordinator.services import alerting
from coordinator.services.capacity_signal import CapacitySignal
from coordinator.services.node_records import settle_pool_moves
from shared.clock import Clock

log = logging.getLogger(__name__)


class ReservationClock:
    def __init__(
        self, ledger: Ledger, clock: Clock, capacity: CapacitySignal, alerts: AlertSink
    ) -> None:
        self.ledger = ledger
        self.clock = clock
        self.capacity = capacity
        self.alerts = alerts
        self._last = clock.now_ms()

    async def tick(self) -> None:
        now = self.clock.now_ms()
        ended = await self.ledger.reservations.expire_and_preempt(now)
        for res in ended:
            log.info("reservation %s %s", res.reservation_id, res.stored_state)
        pools = await self.ledger.reservations.pools_with_boundaries(self._last, now)
        await self.ledger.reservations.refresh_pools(pools, now)
        # Pool memory short in a quarter that has ended, or freed by a booking that did.
        risks = await self.ledger.pool_memory.rejudge(
            pools, now, lambda changes: alerting.risk_alerts(changes, now)
        )
        await alerting.announce(self.alerts, risks)
        self._last = now
        moved = await settle_pool_moves(self.ledger, now)
        for change in moved:
            log.info("node %s moved to pool %s", change.node_id, change.pool_id)
        await alerting.publish(self.alerts, moved, now)
        if ended or pools or moved:
            self.capacity.notify()
