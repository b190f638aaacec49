"""Node state service: turns ingested heartbeats and inventories into ledger writes and
alerts.

The ingest callbacks only touch memory (the liveness tracker and a few pending maps:
`coordinator.services.node_ingest`, which `NodeWatch` extends); the methods the loops in
`coordinator.tasks` drive do the I/O: `write_pending` applies inventories and health
transitions (rare, written at once), `flush_last_seen` writes liveness in one batch,
`sweep` marks silent nodes unreachable (or, when that would be a large fraction of the
fleet at once, holds it as the coordinator's own outage: logged at warning and counted
in `outage_holds`). A duplicate id is recorded as the node's `node.duplicateId` event
and published. Each write is one unit of work from `coordinator.services.node_records`;
its transitions go out through `coordinator.services.alerting`.

Failure is isolated per node: an inventory or transition the ledger refuses is logged
with the node id and counted (`rejected`, and as the ingest drop `ledger_rejected`);
the rest of the batch is still written, health recording never stops.

Unknown nodes cost bounded memory and bounded work: at most `MAX_UNKNOWN_PER_PASS`
(`node_ingest`) are handled per pass (the rest dropped as `unknown_flood`), inventory
requests go out at most `INVENTORY_REQUESTS_PER_S` a second in all and once per node per
`INVENTORY_REQUEST_EVERY_MS`, and the table of recent requests is pruned.

When the coordinator falls behind — more than `backlog_limit` messages wait unread,
or the client dropped messages as a slow consumer — heartbeats may be sitting in (or
lost from) our own queue: that is our outage, handled exactly like a lost NATS link:
the sweep marks nobody and every node is quiet for its own window again.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from coordinator.domain.errors import CoordinatorError, UnknownPool
from coordinator.domain.liveness import LivenessTracker, NodeLiveness
from coordinator.domain.ports import AlertSink, Publisher
from coordinator.ledger import Ledger, LedgerUnavailable, NotLeader
from coordinator.runtime.gc_pause import gc_paused
from coordinator.services import alerting
from coordinator.services.capacity_signal import CapacitySignal
from coordinator.services.node_ingest import MAX_UNKNOWN_PER_PASS, NodeIngest, UseSink
from coordinator.services.node_records import (
    NotRecorded,
    UntrueInventory,
    hold_duplicates,
    record_duplicate_id,
    record_heartbeat,
    record_inventories,
    record_inventory,
    record_reachability,
)
from procs.log_throttle import LogThrottle
from shared.clock import Clock
from shared.subjects import Subjects
from shared.wire import Heartbeat, Inventory

log = logging.getLogger(__name__)

INVENTORY_REQUEST_EVERY_MS = 5000
# Inventories recorded per unit of work when many arrive at once (a fleet booting).
INVENTORY_BATCH = 500
INVENTORY_REQUESTS_PER_S = 200
POOL_REFRESH_EVERY_MS = 1000
# The table of recent inventory requests never holds more than this many nodes: it is
# pruned past MAX_UNKNOWN_PER_PASS, and only a window's worth of requests are recent.
MAX_REQUEST_TABLE = MAX_UNKNOWN_PER_PASS + (
    INVENTORY_REQUESTS_PER_S * INVENTORY_REQUEST_EVERY_MS // 1000
)

K = TypeVar("K")
V = TypeVar("V")


def _keep(pending: dict[K, V], taken: dict[K, V]) -> None:
    """Put back what a failed write took; what arrived meanwhile is newer and stays."""
    for key, value in taken.items():
        pending.setdefault(key, value)


class NodeWatch(NodeIngest):
    """The node watch: the ingest callbacks (`NodeIngest`) and the loops that write what
    they left (this class)."""

    def __init__(
        self,
        ledger: Ledger,
        tracker: LivenessTracker,
        subjects: Subjects,
        clock: Clock,
        bus: Publisher,
        alerts: AlertSink,
        drop: Callable[[str, str], None],
        capacity: CapacitySignal | None = None,
        is_leader: Callable[[], bool] = lambda: True,
        backlog: Callable[[], int] = lambda: 0,
        backlog_limit: int = 10_000,
        use: UseSink | None = None,
    ) -> None:
        super().__init__(tracker, subjects, clock, drop, is_leader, use, LogThrottle(log))
        self.backlog = backlog
        self.backlog_limit = backlog_limit
        self._behind = False
        self._rearm_due = False  # messages were lost since the last sweep (`fell_behind`)
        self.capacity = capacity or CapacitySignal()
        self.ledger = ledger
        self.bus = bus
        self.alerts = alerts
        self._inv_requested: dict[str, int] = {}
        self._known_pools: set[str] = set()
        # Sweeps held as our own outage.
        self.outage_holds = 0
        # Writes the ledger refused (one node's bad data); episodes of falling behind.
        self.rejected = 0
        self.behind_episodes = 0
        self._pools_checked_at = -POOL_REFRESH_EVERY_MS
        self._requests_window = (0, 0)  # (second, requests sent in it)

    async def load(self) -> None:
        now = self.clock.now_ms()
        for record in await self.ledger.nodes.liveness_snapshot():
            self.tracker.load(
                NodeLiveness(
                    node_id=record.node_id,
                    pool_id=record.pool_id,
                    last_seen=record.last_seen,
                    interval_ms=record.interval_ms,
                    reachable=record.reachable,
                    health=record.health,
                    inventory_hash=record.inventory_hash,
                ),
                now,
            )
        self._known_pools = {p.pool_id for p in await self.ledger.pools.list_all()}

    # -- ingest callbacks: memory only (the rest are `NodeIngest`'s) ---------------------

    def fell_behind(self) -> None:
        """Messages were lost on our side (slow consumer): nobody's silence counts
        until each node has had its own window again."""
        self.behind_episodes += 1
        self._throttle.warning(
            "behind",
            "the coordinator dropped NATS messages (slow consumer): judging nobody"
            " until every node has had its window again",
        )
        # Rearming touches every node; a slow consumer reports each message it drops
        # (thousands a second when behind), and rearming on each made falling behind
        # worse. The sweep, the only judge of the quiet windows, rearms first thing.
        self._rearm_due = True

    # -- loops -----------------------------------------------------------------------------

    async def write_pending(self) -> None:
        now = self.clock.now_ms()
        inventories, self._inventories = self._inventories, {}
        came_back, self._came_back = self._came_back, {}
        duplicates, self._duplicates = self._duplicates, {}
        dirty, self._health_dirty = self._health_dirty, {}
        try:
            await self._write(now, inventories, came_back, duplicates, dirty)
        except Exception:
            # The ledger went away mid-way (or we lost the lead): keep what was taken for
            # the next round; what arrived since is newer and wins. Writing a part twice
            # is harmless: a change already recorded is no transition the second time.
            _keep(self._inventories, inventories)
            _keep(self._came_back, came_back)
            _keep(self._duplicates, duplicates)
            _keep(self._health_dirty, dirty)
            raise
        unknown, self._unknown = self._unknown, {}
        self._prune_requests(now)
        for node_id, pool_id in unknown.items():
            await self._request_inventory(pool_id, node_id, now)

    async def _write(
        self,
        now: int,
        inventories: dict[str, Inventory],
        came_back: dict[str, str],
        duplicates: dict[str, tuple[str, str]],
        dirty: dict[str, Heartbeat],
    ) -> None:
        if self._seen_as_follower:
            # Just took over: what the old leader already recorded need not be redone.
            stored = await self.ledger.nodes.inventory_hashes(self._seen_as_follower)
            self._seen_as_follower.clear()
            for node_id, digest in stored.items():
                inv = inventories.get(node_id)
                if inv is not None and inv.inventory_hash == digest:
                    del inventories[node_id]
                    node = self.tracker.nodes.get(node_id)
                    if node is not None:
                        node.inventory_hash = digest
        batch = list(inventories.values())
        # A fleet registering: no collector passes over the whole heap meanwhile.
        with gc_paused(len(batch) > INVENTORY_BATCH):
            for i in range(0, len(batch), INVENTORY_BATCH):
                await self._apply_inventories(batch[i : i + INVENTORY_BATCH], now)
        if came_back:
            try:
                flipped = await record_reachability(self.ledger, came_back, True, now)
            except Exception as exc:
                # Retried next pass; the health changes below still go through.
                for node_id, pool_id in came_back.items():
                    self._came_back.setdefault(node_id, pool_id)
                log.warning("could not record %d nodes as reachable: %s", len(came_back), exc)
            else:
                await alerting.publish(self.alerts, flipped, now)
        for node_id, (boot_id, other) in duplicates.items():
            pool_id = self._pool_of(node_id)
            await self._isolated(
                node_id, pool_id, self._record_duplicate(node_id, boot_id, other, now)
            )
        for hb in dirty.values():
            await self._isolated(hb.node_id, hb.pool_id, self._record_health(hb, now))
        if inventories or came_back or dirty:
            # A node came back or changed health: waiting requests may fit now.
            self.capacity.notify()

    async def _apply_inventories(self, invs: list[Inventory], now: int) -> None:
        """One unit of work for a batch (a fleet registering is seconds, not minutes);
        an inventory the ledger refuses is dropped and counted, the rest recorded. Should
        the batch fail as a whole, each inventory is tried alone."""
        try:
            outcomes = await record_inventories(self.ledger, invs, now)
        except Exception as exc:
            log.warning("a batch of %d inventories failed (%s): one at a time", len(invs), exc)
            for inv in invs:
                await self._isolated(inv.node_id, inv.pool_id, self._apply_inventory(inv, now))
            return
        for inv, outcome in zip(invs, outcomes, strict=True):
            if isinstance(outcome, NotRecorded):
                self._refused(inv, outcome.error)
            else:
                self._recorded(inv, now)
                await alerting.publish(self.alerts, [outcome], now)

    def _pool_of(self, node_id: str) -> str:
        node = self.tracker.nodes.get(node_id)
        return node.pool_id if node is not None else "?"

    async def _isolated(self, node_id: str, pool_id: str, write: Awaitable[None]) -> None:
        """One node's write; if the ledger refuses it, the others still go through. The
        ledger being away (or this replica no longer leading) is no refusal: that raises,
        and `write_pending` keeps what it took for the next round."""
        try:
            await write
        except (LedgerUnavailable, NotLeader):
            raise
        except Exception as exc:
            self.rejected += 1
            self._drop("ledger_rejected", self.subjects.inventory(pool_id, node_id))
            log.warning("node %s: the ledger refused its update: %s", node_id, exc)

    async def _record_duplicate(self, node_id: str, boot_id: str, other: str, now: int) -> None:
        duplicate = await record_duplicate_id(self.ledger, node_id, boot_id, other, now)
        if duplicate is not None:
            log.warning("node %s: two boots interleave (%s, %s)", node_id, boot_id, other)
            await alerting.publish(self.alerts, [duplicate], now)

    async def _record_health(self, hb: Heartbeat, now: int) -> None:
        changes = await record_heartbeat(self.ledger, hb, now)
        if changes is not None:
            await alerting.publish(self.alerts, [changes], now)

    async def _apply_inventory(self, inv: Inventory, now: int) -> None:
        try:
            changes = await record_inventory(self.ledger, inv, now)
        except CoordinatorError as exc:
            self._refused(inv, exc)
            return
        self._recorded(inv, now)
        await alerting.publish(self.alerts, [changes], now)

    def _refused(self, inv: Inventory, error: CoordinatorError) -> None:
        subject = self.subjects.inventory(inv.pool_id, inv.node_id)
        if isinstance(error, UnknownPool):
            self._drop("unknown_pool", subject)
            return
        if isinstance(error, UntrueInventory):
            # Counted by why (`UNTRUE_REASONS`): a host claiming what it cannot have.
            self._drop(error.reason, subject)
            self._throttle.warning(
                error.reason, "node %s: inventory refused: %s", inv.node_id, error.message
            )
            return
        self.rejected += 1
        self._drop("ledger_rejected", subject)
        self._throttle.warning(
            "refused", "node %s: the ledger refused its inventory: %s", inv.node_id, error
        )

    def _recorded(self, inv: Inventory, now: int) -> None:
        self._known_pools.add(inv.pool_id)
        self._track(inv, now)

    def _prune_requests(self, now: int) -> None:
        if len(self._inv_requested) > MAX_UNKNOWN_PER_PASS:
            cutoff = now - INVENTORY_REQUEST_EVERY_MS
            self._inv_requested = {n: t for n, t in self._inv_requested.items() if t > cutoff}

    async def _request_inventory(self, pool_id: str, node_id: str, now: int) -> None:
        if pool_id not in self._known_pools:
            # A pool created after start: look again (at most once a second) before
            # calling it unknown.
            if now - self._pools_checked_at >= POOL_REFRESH_EVERY_MS:
                self._pools_checked_at = now
                self._known_pools = {p.pool_id for p in await self.ledger.pools.list_all()}
            if pool_id not in self._known_pools:
                self._drop("unknown_pool", self.subjects.heartbeat(pool_id, node_id))
                return
        if now - self._inv_requested.get(node_id, -INVENTORY_REQUEST_EVERY_MS) < (
            INVENTORY_REQUEST_EVERY_MS
        ):
            return
        second, sent = self._requests_window
        if now // 1000 != second:
            second, sent = now // 1000, 0
        if sent >= INVENTORY_REQUESTS_PER_S:
            self._drop("unknown_flood", self.subjects.heartbeat(pool_id, node_id))
            return
        self._requests_window = (second, sent + 1)
        self._inv_requested[node_id] = now
        try:
            await self.bus.publish(self.subjects.inventory_request(pool_id, node_id), b"{}")
        except Exception as exc:
            log.warning("could not ask %s for its inventory: %s", node_id, exc)

    async def hold_duplicates(self) -> None:
        """Hold, with their alerts, the nodes no change has judged that show a device
        another node holds (`node_records.hold_duplicates`): at start, before the
        rollup is served, and before each rebuild."""
        now = self.clock.now_ms()
        held = await hold_duplicates(self.ledger, now)
        if held:
            log.warning("%d nodes show devices other nodes hold: held in provisioning", len(held))
            await alerting.publish(self.alerts, held, now)

    async def flush_last_seen(self) -> None:
        batch = self.tracker.take_unflushed()
        if batch:
            try:
                await self.ledger.nodes.flush_last_seen(batch)
            except Exception:
                # Put them back so that the next flush carries them (newer values win).
                for node_id, value in batch.items():
                    self.tracker.unflushed.setdefault(node_id, value)
                raise

    async def sweep(self) -> None:
        now = self.clock.now_ms()
        if self._rearm_due:
            self._rearm_due = False
            self.tracker.rearm(now)
        backlog = self.backlog()
        if backlog > self.backlog_limit:
            # Heartbeats may be waiting in our own queue: judge nobody, and give every
            # node its own window again once we have caught up (like a reconnect).
            if not self._behind:
                self._behind = True
                self.behind_episodes += 1
                log.warning(
                    "ingest is behind by %d messages: taken as the coordinator's own outage,"
                    " nobody marked unreachable until it catches up",
                    backlog,
                )
            self.tracker.rearm(now)
            return
        if self._behind:
            self._behind = False
            self.tracker.rearm(now)
            log.info("ingest caught up: each node quiet for its own window from now")
            return
        result = self.tracker.sweep(now)
        if result.held:
            self.outage_holds += 1
            log.warning(
                "%d of %d reachable nodes fell silent at once: taken as the coordinator's"
                " own outage, none marked unreachable; each node quiet for its window again",
                result.held,
                sum(1 for n in self.tracker.nodes.values() if n.reachable),
            )
            return
        if result.believed:
            log.warning(
                "%d nodes still silent after their quiet windows with NATS up: marking them",
                len(result.expired),
            )
        if not result.expired:
            return
        flipped = await record_reachability(self.ledger, result.expired, False, now)
        self.tracker.mark_unreachable(result.expired)
        await alerting.publish(self.alerts, flipped, now)
