"""What the clock does to reservations: leases that ran out expire, noticed spot
reservations become preempted, and pools whose bookings started or ended get their
allocated/reserved columns refreshed — with no request in between."""

from __future__ import annotations

import logging

from coordinator.capacity_signal import CapacitySignal
from coordinator.domain.clock import Clock
from coordinator.ledger import Ledger

log = logging.getLogger(__name__)


class ReservationClock:
    def __init__(self, ledger: Ledger, clock: Clock, capacity: CapacitySignal) -> None:
        self.ledger = ledger
        self.clock = clock
        self.capacity = capacity
        self._last = clock.now_ms()

    async def tick(self) -> None:
        now = self.clock.now_ms()
        ended = await self.ledger.reservations.expire_and_preempt(now)
        for res in ended:
            log.info("reservation %s %s", res.reservation_id, res.stored_state)
        pools = await self.ledger.reservations.pools_with_boundaries(self._last, now)
        await self.ledger.reservations.refresh_pools(pools, now)
        self._last = now
        if ended or pools:
            self.capacity.notify()
