"""The node watch's ingest half (`NodeIngest`): what heartbeats, inventories and use
reports leave in memory for the loops of `coordinator.services.node_watch` to write. No
I/O here: the tracker judges each heartbeat; health changes, nodes back from silence,
duplicate ids and inventories wait in pending maps; use goes on to the use watch.
Heartbeats the tracker ignores (an older `seq`, the other host of a duplicate node id)
are dropped and counted like bad messages. Unknown nodes cost bounded memory: at most
`MAX_UNKNOWN_PER_PASS` are noted per pass (the rest dropped as `unknown_flood`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from coordinator.domain.liveness import APPLIED, LivenessTracker, NodeLiveness
from procs.log_throttle import LogThrottle
from shared.clock import Clock
from shared.subjects import Subjects
from shared.wire import Heartbeat, Inventory, UseReport

MAX_UNKNOWN_PER_PASS = 1000


class UseSink(Protocol):
    """Where the use that heartbeats and reports carry goes (`services.gpu_use_watch`):
    each answers how many devices it dropped as not in the node's inventory."""

    def on_heartbeat(self, hb: Heartbeat) -> int: ...

    def on_report(self, report: UseReport) -> int: ...

    def on_inventory(self, inv: Inventory) -> None: ...


class NodeIngest:
    """The ingest callbacks, memory only. `drop` counts a dropped message by reason and
    subject; `throttle` is the watch's, so its warnings keep their logger."""

    def __init__(
        self,
        tracker: LivenessTracker,
        subjects: Subjects,
        clock: Clock,
        drop: Callable[[str, str], None],
        is_leader: Callable[[], bool],
        use: UseSink | None,
        throttle: LogThrottle,
    ) -> None:
        # Use rides on heartbeats the tracker accepted, and reports of known nodes only.
        self.use = use
        self.is_leader = is_leader
        # Inventories that arrived while another replica led (and probably wrote them).
        self._seen_as_follower: set[str] = set()
        self.tracker = tracker
        self.subjects = subjects
        self.clock = clock
        self._drop = drop
        self._inventories: dict[str, Inventory] = {}
        self._health_dirty: dict[str, Heartbeat] = {}
        self._came_back: dict[str, str] = {}
        self._unknown: dict[str, str] = {}
        self._duplicates: dict[str, tuple[str, str]] = {}
        self._throttle = throttle
        # Heartbeats whose interval was out of bounds.
        self.interval_clamped = 0

    def on_heartbeat(self, hb: Heartbeat) -> None:
        outcome = self.tracker.on_heartbeat(hb, self.clock.now_ms())
        if outcome is APPLIED:
            # The common case: only last-seen moved (and, from agents that report it,
            # what the GPUs run).
            if hb.use_version and self.use is not None:
                self._use_heartbeat(hb)
            return
        if not outcome.known:
            self._note_unknown(hb)
            return
        if outcome.duplicate is not None:
            self._duplicates[hb.node_id] = outcome.duplicate
        if outcome.ignored is not None:
            self._drop(outcome.ignored, self.subjects.heartbeat(hb.pool_id, hb.node_id))
            return
        if outcome.interval_clamped:
            self.interval_clamped += 1
            self._throttle.warning(
                "interval",
                "node %s announces a %d ms interval, outside [%d, %d] ms: judged by %d ms",
                hb.node_id,
                hb.interval_ms,
                self.tracker.min_interval_ms,
                self.tracker.max_interval_ms,
                self.tracker.clamp(hb.interval_ms),
            )
        if outcome.health_changed:
            self._health_dirty[hb.node_id] = hb
        if outcome.came_back:
            self._came_back[hb.node_id] = hb.pool_id
        if outcome.needs_inventory:
            self._note_unknown(hb)
        elif hb.use_version and self.use is not None:
            self._use_heartbeat(hb)

    def _use_heartbeat(self, hb: Heartbeat) -> None:
        assert self.use is not None
        unknown = self.use.on_heartbeat(hb)
        if unknown:
            subject = self.subjects.heartbeat(hb.pool_id, hb.node_id)
            self._unknown_devices(hb.node_id, unknown, subject)

    def _unknown_devices(self, node_id: str, count: int, subject: str) -> None:
        """A message named devices its node's inventory does not have: they were dropped
        (the rest of it applied); counted once per message, logged with the node."""
        self._drop("unknown_device", subject)
        self._throttle.warning(
            "unknown_device",
            "node %s: use of %d device(s) its inventory does not have, dropped",
            node_id,
            count,
        )

    def on_use_report(self, report: UseReport) -> None:
        subject = self.subjects.use(report.pool_id, report.node_id)
        if self.use is None:
            return
        if report.node_id not in self.tracker.nodes:
            self._drop("unknown_node", subject)
            return
        if self.tracker.is_rival(report.node_id, report.boot_id, self.clock.now_ms()):
            self._drop("duplicate_id", subject)
            return
        unknown = self.use.on_report(report)
        if unknown:
            self._unknown_devices(report.node_id, unknown, subject)

    def _note_unknown(self, hb: Heartbeat) -> None:
        if hb.node_id in self._unknown or len(self._unknown) < MAX_UNKNOWN_PER_PASS:
            self._unknown[hb.node_id] = hb.pool_id
        else:
            self._drop("unknown_flood", self.subjects.heartbeat(hb.pool_id, hb.node_id))

    def on_inventory(self, inv: Inventory) -> None:
        if self.tracker.is_rival(inv.node_id, inv.boot_id, self.clock.now_ms()):
            # The other host of a duplicate id must not rewrite this node's devices.
            self._drop("duplicate_id", self.subjects.inventory(inv.pool_id, inv.node_id))
            return
        self._inventories[inv.node_id] = inv
        if not self.is_leader():
            # The leader records it; a follower only keeps its tracker warm for takeover.
            self._seen_as_follower.add(inv.node_id)
            self._track(inv, self.clock.now_ms())

    def _track(self, inv: Inventory, now: int) -> None:
        node = self.tracker.nodes.get(inv.node_id)
        if node is None:
            node = NodeLiveness(inv.node_id, inv.pool_id, now, 5000)
            self.tracker.nodes[inv.node_id] = node
        node.pool_id = inv.pool_id
        node.inventory_hash = inv.inventory_hash
        node.health = inv.health.status
        node.devices = frozenset(inv.devices)
        node.provisioning = inv.provisioning
        node.last_seen = now
        if self.use is not None:
            self.use.on_inventory(inv)
