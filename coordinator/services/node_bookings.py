"""Telling each agent the bookings on its node (`Subjects.bookings`, SPEC §10).

The leader's `tick` (a named loop) reads the pools' version counters, one small table;
for each pool whose counters moved since the last tick — a booking committed, released,
renewed, expired, preempted, or the pool's nodes changed — it reads the pool's bookings
that have not ended and recomputes every node's `NodeBookings`; a node whose etag moved
is published at once. The content also changes by the clock alone (a booking starts:
`scheduled` → `active`; one ends), so each pool's first such moment is kept and the pool
recomputed when it comes. The first read after start publishes nothing: the agents
already hold what the last leader sent, and the etag, a hash of the content, is the
same on every replica.

Heartbeats carry the etag the agent holds. `on_heartbeat` compares it with the node's
current one, a dict lookup and a string compare (ingest calls it for every heartbeat);
when they differ the node is due a re-send, at most once per `resend_every_ms` per
node. That is what makes an agent current again after any reconnect, restart or lost
message, with no JetStream KV: within one heartbeat and one tick. A node with no
bookings has the empty list's etag, so a new agent is told "none" too.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from dataclasses import dataclass

from coordinator.domain.node_bookings import (
    EMPTY_ETAG,
    PoolVersion,
    etag,
    next_change,
    node_bookings,
)
from coordinator.domain.ports import Publisher
from coordinator.ledger import Ledger
from procs.log_throttle import LogThrottle
from shared.clock import Clock
from shared.subjects import Subjects
from shared.wire import BOOKINGS_RESEND_MS, Heartbeat, NodeBooking, NodeBookings

log = logging.getLogger(__name__)

RESEND_EVERY_MS = BOOKINGS_RESEND_MS
PUBLISH_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class Current:
    pool_id: str
    etag: str
    bookings: tuple[NodeBooking, ...]


class NodeBookingsBroadcast:
    def __init__(
        self,
        ledger: Ledger,
        subjects: Subjects,
        clock: Clock,
        bus: Publisher,
        resend_every_ms: int = RESEND_EVERY_MS,
    ) -> None:
        self.ledger = ledger
        self.subjects = subjects
        self.clock = clock
        self.bus = bus
        self.resend_every_ms = resend_every_ms
        # Nodes with bookings only; every other node's etag is EMPTY_ETAG.
        self._current: dict[str, Current] = {}
        self._versions: dict[str, PoolVersion] | None = None
        self._moments: dict[str, int] = {}  # pool → when to recompute it by the clock
        # Changes computed and not yet sent (a tick that failed half way sends them next).
        self._changed: dict[str, Current] = {}
        self._due: dict[str, tuple[str, str]] = {}  # node → (pool to send on, etag it holds)
        self._sent_at: dict[str, int] = {}  # node → when it was last sent (monotonic ms)
        self._throttle = LogThrottle(log)
        self.sent: Counter[str] = Counter()  # by why: "change", "resend"
        self.failures = 0

    @property
    def loaded(self) -> bool:
        """Whether the first read is done (until then every node looks empty)."""
        return self._versions is not None

    def etag_of(self, node_id: str) -> str:
        current = self._current.get(node_id)
        return current.etag if current is not None else EMPTY_ETAG

    def current(self, node_id: str) -> tuple[NodeBooking, ...]:
        current = self._current.get(node_id)
        return current.bookings if current is not None else ()

    # -- ingest: memory only, O(1) -------------------------------------------------------

    def on_heartbeat(self, hb: Heartbeat) -> None:
        current = self._current.get(hb.node_id)
        if hb.bookings_etag == (current.etag if current is not None else EMPTY_ETAG):
            return
        self._due[hb.node_id] = (hb.pool_id, hb.bookings_etag)

    # -- the leader's loop ---------------------------------------------------------------

    async def tick(self) -> None:
        now = self.clock.now_ms()
        versions = await self.ledger.node_bookings.versions()
        first = self._versions is None
        seen = self._versions or {}
        pools = {pool for pool, v in versions.items() if seen.get(pool) != v}
        pools |= {pool for pool, when in self._moments.items() if when <= now}
        for pool_id in sorted(pools):
            self._changed.update(await self._recompute(pool_id, now))
        self._versions = versions
        changed, self._changed = self._changed, {}
        if not first:
            for node_id, current in changed.items():
                self._due.pop(node_id, None)
                await self._send(node_id, current, "change")
        await self._resend_due()

    async def _recompute(self, pool_id: str, now: int) -> dict[str, Current]:
        held = await self.ledger.node_bookings.pool(pool_id, now)
        fresh = node_bookings(held.rows, held.reservations, now)
        was = {n for n, c in self._current.items() if c.pool_id == pool_id}
        changed: dict[str, Current] = {}
        self._moments.pop(pool_id, None)
        for node_id in sorted(was | fresh.keys()):
            bookings = fresh.get(node_id, ())
            new = Current(pool_id, etag(bookings), bookings)
            if new.etag != self.etag_of(node_id):
                changed[node_id] = new
            if bookings:
                self._current[node_id] = new
            else:
                self._current.pop(node_id, None)
            moment = next_change(bookings, held.reservations, now)
            if moment is not None:
                self._moments[pool_id] = min(moment, self._moments.get(pool_id, moment))
        return changed

    async def _resend_due(self) -> None:
        if not self._due:
            return
        due, self._due = self._due, {}
        now = self.clock.monotonic() * 1000
        for node_id, (pool_id, held) in due.items():
            current = self._current.get(node_id) or Current(pool_id, EMPTY_ETAG, ())
            if held == current.etag:
                continue  # it caught up meanwhile (a change was sent)
            last = self._sent_at.get(node_id)
            if last is not None and now - last < self.resend_every_ms:
                continue  # its next heartbeat asks again
            await self._send(node_id, current, "resend")
        if len(self._sent_at) > 2 * max(1024, len(self._current)):
            cutoff = now - self.resend_every_ms
            self._sent_at = {n: t for n, t in self._sent_at.items() if t >= cutoff}

    async def _send(self, node_id: str, current: Current, why: str) -> None:
        body = NodeBookings(
            node_id=node_id,
            etag=current.etag,
            sent_at=self.clock.now_ms(),
            bookings=current.bookings,
        ).to_json()
        subject = self.subjects.bookings(current.pool_id, node_id)
        try:
            await asyncio.wait_for(self.bus.publish(subject, body), PUBLISH_TIMEOUT_S)
        except Exception as exc:  # the bus is away: the next heartbeat asks again
            self.failures += 1
            self._throttle.warning("publish", "bookings for %s not sent: %r", node_id, exc)
            return
        self._sent_at[node_id] = int(self.clock.monotonic() * 1000)
        self.sent[why] += 1
