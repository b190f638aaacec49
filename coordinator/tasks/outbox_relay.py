"""The outbox relay: publishes the alerts the ledger committed and marks them sent.

Leader only. Every replica writes alerts into the outbox with its transitions (the
API's maintenance and bookings run on any replica), but only the leader drains it, in
the order written, one acknowledged publish at a time; its "sent" marks are fenced
leader writes, so a replica that lost the lead stops marking. A publish that is not
acknowledged (JetStream away, a stream leader election) ends the round, the row's
attempt is counted, and the next round, `interval_s` later, starts again from the
oldest unsent row: order is kept and nothing is skipped. An alert that was stored but
whose mark did not commit (the coordinator died between them, or lost the lead) is sent
again by whoever leads next, and the stream stores it once (`Nats-Msg-Id`).

It is also the coordinator's alert sink: a service that committed alerts announces
them here, which only wakes the relay early (on the leader the alert goes out at once
rather than at the next round).

The leader refreshes the backlog figures (unsent count, oldest unsent alert's time)
for its metrics, at most once a second (a follower exports no fleet series, see
`coordinator.runtime.metrics`); sent rows are dropped after `keep_sent_ms`.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import AbstractContextManager
from typing import Protocol

from coordinator.ledger import Ledger, OutboxBacklog
from procs.log_throttle import LogThrottle
from shared.clock import Clock
from shared.wire import Alert

log = logging.getLogger(__name__)

BATCH = 100
STATS_EVERY_MS = 1000
PURGE_EVERY_MS = 60_000


class AlertStore(Protocol):
    """Where alerts are stored for good (`coordinator.bus.alerts.AlertStream`)."""

    ready: bool

    async def setup(self) -> None: ...

    async def publish(self, alert: Alert) -> bool: ...


class LeaderGuard(Protocol):
    @property
    def is_leader(self) -> bool: ...

    def fenced(self) -> AbstractContextManager[None]: ...


class OutboxRelay:
    def __init__(
        self,
        ledger: Ledger,
        store: AlertStore,
        clock: Clock,
        leader: LeaderGuard,
        *,
        interval_s: float = 0.1,
        keep_sent_ms: int = 3_600_000,
    ) -> None:
        self.ledger = ledger
        self.store = store
        self.clock = clock
        self.leader = leader
        self.interval_s = interval_s
        self.keep_sent_ms = keep_sent_ms
        self.backlog = OutboxBacklog(0, None)
        self.sent = 0
        self.failures = 0
        self._wake = asyncio.Event()
        self._stats_at = -STATS_EVERY_MS
        self._purged_at = 0
        self._throttle = LogThrottle(log)

    # -- the alert sink ------------------------------------------------------------------

    async def publish(self, alert: Alert) -> None:
        """An alert was committed to the outbox: drain soon."""
        self._wake.set()

    # -- the loop ------------------------------------------------------------------------

    def oldest_age_s(self) -> float:
        oldest = self.backlog.oldest_created_at
        if oldest is None:
            return 0.0
        return max(0.0, (self.clock.now_ms() - oldest) / 1000)

    async def tick(self) -> None:
        """One round, then wait for the next (or a wake-up); the named loop's body."""
        try:
            now = self.clock.now_ms()
            if self.leader.is_leader:
                if now - self._stats_at >= STATS_EVERY_MS:
                    self._stats_at = now
                    self.backlog = await self.ledger.outbox.backlog()
                with self.leader.fenced():
                    await self.drain()
                    await self._purge(now)
        finally:
            try:
                # Not `wait_for`: on 3.11 it swallows a cancel that arrives as the event
                # is set (a wake-up during shutdown), and the loop never stopped.
                async with asyncio.timeout(self.interval_s):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()

    async def drain(self) -> int:
        """Publish unsent alerts in order until none are left or one is not stored;
        returns how many were marked sent."""
        if not self.store.ready:
            try:
                await self.store.setup()
            except Exception as exc:
                self.failures += 1
                self._throttle.warning("setup", "alert stream not set up yet: %s; will retry", exc)
                return 0
        marked = 0
        while True:
            batch = await self.ledger.outbox.unsent(BATCH)
            stored: list[int] = []
            failed = None
            for pending in batch:
                try:
                    await self.store.publish(pending.alert)
                except Exception as exc:
                    failed = pending.seq
                    self.failures += 1
                    self._throttle.warning(
                        "publish",
                        "alert %s not stored yet (try %d): %s; will retry",
                        pending.alert.alert_id,
                        pending.attempts + 1,
                        exc,
                    )
                    break
                stored.append(pending.seq)
            marked += await self.ledger.outbox.mark_sent(stored, self.clock.now_ms())
            self.sent += len(stored)
            if failed is not None:
                await self.ledger.outbox.note_attempt(failed)
                return marked
            if len(batch) < BATCH:
                if marked:
                    self._stats_at = -STATS_EVERY_MS  # show the drained backlog at once
                return marked

    async def _purge(self, now: int) -> None:
        if now - self._purged_at < PURGE_EVERY_MS:
            return
        self._purged_at = now
        await self.ledger.outbox.purge_sent(now - self.keep_sent_ms)
