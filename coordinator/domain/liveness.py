"""In-memory liveness and health of every node, fed by heartbeats (pure; `now` is passed).

Heartbeats never touch SQL one by one: the tracker keeps last-seen per node and marks
what needs writing (health changes, nodes coming back, inventories to ask for). The
coordinator's own clock decides liveness, never the agent's `sentAt` (clock skew).

The rules (SPEC §3-4):

- A node is unreachable after `misses × interval` of silence, its own interval as it
  last announced it, clamped to [`min_interval_ms`, `max_interval_ms`] so one agent
  cannot make itself (nearly) unjudgeable or judged faster than the sweep can see.
- Nothing is marked while the coordinator is cut off from NATS; after it (re)connects
  or starts, each node is quiet for ITS OWN window (`quiet_until`), never the fleet's
  largest: a 3600 s node does not shield a 1 s node.
- A sweep that would mark a large fraction of the reachable fleet at once
  (> `outage_fraction` and at least `outage_min_nodes` nodes) is our outage, not
  theirs: it marks nothing and re-arms every node's quiet window. If the same mass
  silence comes back right after those windows with the bus up all along, it is
  believed and marked, so a real rack-wide loss is not hidden forever.
- `bootId`/`seq`: an older `seq` of the same boot is ignored; a new boot starts its
  sequence over. The boot before the current one speaking again with a newer `seq`
  means two hosts share the node id: `duplicate` is reported once per episode and the
  other boot's heartbeats are ignored (the node's state does not flap between two
  hosts), until the current boot falls silent for a window and the other takes over.

Hysteresis: losing a node is immediate, but an unreachable node is reachable again only
after its heartbeats have kept coming for `recovery_hold_ms` without a gap longer than
its detection window, so a flapping node yields one alert, not a storm.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from shared.wire import DeviceHealth, HealthStatus, Heartbeat

Ignored = Literal["stale_seq", "duplicate_id"]


@dataclass(slots=True)
class NodeLiveness:
    node_id: str
    pool_id: str
    last_seen: int
    interval_ms: int
    reachable: bool = True
    health: HealthStatus = "healthy"
    devices: frozenset[DeviceHealth] = frozenset()
    provisioning: bool = False
    inventory_hash: str = ""
    boot_id: str = ""
    back_since: int | None = None
    # Newest seq of `boot_id` (-1: none heard since we started).
    seq: int = -1
    # Nothing marks this node unreachable before this time (our start or reconnect).
    quiet_until: int = 0
    # The boot before `boot_id`, and its newest seq: a replay of it is stale, a newer seq
    # from it means another host uses this node id.
    prev_boot: str = ""
    prev_seq: int = -1
    # While the other boot keeps speaking, the duplicate episode lasts until then.
    rival_until: int | None = None


@dataclass(frozen=True, slots=True)
class HeartbeatOutcome:
    known: bool
    needs_inventory: bool = False
    health_changed: bool = False
    came_back: bool = False
    # Why the heartbeat changed nothing (None: it was applied).
    ignored: Ignored | None = None
    # A duplicate-id episode begins: (the boot we follow, the other boot).
    duplicate: tuple[str, str] | None = None
    # The interval the agent announced was out of bounds and was clamped.
    interval_clamped: bool = False


UNKNOWN = HeartbeatOutcome(known=False, needs_inventory=True)
APPLIED = HeartbeatOutcome(known=True)
NO_DEVICES: frozenset[DeviceHealth] = frozenset()


@dataclass(frozen=True, slots=True)
class SweepResult:
    """What a sweep decided: the nodes to mark unreachable, or a hold (`held` nodes
    would have been marked); `believed` when a mass silence outlasted its hold."""

    expired: tuple[str, ...] = ()
    held: int = 0
    believed: bool = False


@dataclass(slots=True)
class LivenessTracker:
    misses: int = 3
    recovery_hold_ms: int = 10_000
    min_interval_ms: int = 200
    max_interval_ms: int = 300_000
    outage_fraction: float = 0.5
    outage_min_nodes: int = 5
    nodes: dict[str, NodeLiveness] = field(default_factory=dict)
    # Pending last-seen writes, flushed in one statement: nodeId → (lastSeen, intervalMs).
    unflushed: dict[str, tuple[int, int]] = field(default_factory=dict)
    bus_connected: bool = False
    # A mass silence seen again before this time (after a hold) is believed.
    believe_until: int = 0

    def clamp(self, interval_ms: int) -> int:
        return min(max(interval_ms, self.min_interval_ms), self.max_interval_ms)

    def window_ms(self, interval_ms: int) -> int:
        return self.misses * self.clamp(interval_ms)

    def load(self, node: NodeLiveness, now: int) -> None:
        """Seed from the ledger at start: quiet for its own window from now."""
        node.interval_ms = self.clamp(node.interval_ms)
        node.quiet_until = now + self.window_ms(node.interval_ms)
        self.nodes[node.node_id] = node

    def rearm(self, now: int) -> None:
        """Every node quiet for its own window from now (our outage, not theirs)."""
        for node in self.nodes.values():
            node.quiet_until = max(node.quiet_until, now + self.window_ms(node.interval_ms))

    def bus_up(self, now: int) -> None:
        self.bus_connected = True
        self.believe_until = 0
        self.rearm(now)

    def bus_down(self) -> None:
        self.bus_connected = False

    def on_heartbeat(self, hb: Heartbeat, now: int) -> HeartbeatOutcome:
        # The hot path of ingest (tens of thousands a second): a heartbeat that changes
        # nothing but last-seen allocates nothing and returns the shared APPLIED.
        node = self.nodes.get(hb.node_id)
        if node is None or node.pool_id != hb.pool_id:
            return UNKNOWN
        announced = interval = hb.interval_ms
        if interval < self.min_interval_ms:  # `clamp`, inline on the hot path
            interval = self.min_interval_ms
        elif interval > self.max_interval_ms:
            interval = self.max_interval_ms
        if hb.boot_id == node.boot_id and hb.seq > node.seq:
            node.seq = hb.seq  # the common case of `_boot`: the next beat of this boot
        else:
            refused = self._boot(node, hb, interval, now)
            if refused is not None:
                return refused
        came_back = False
        if not node.reachable:
            if node.back_since is None or now - node.last_seen > self.misses * interval:
                node.back_since = now
            if now - node.back_since >= self.recovery_hold_ms:
                node.reachable, node.back_since, came_back = True, None, True
        node.last_seen = now
        node.interval_ms = interval
        self.unflushed[hb.node_id] = (now, interval)
        devices = frozenset(hb.devices) if hb.devices else NO_DEVICES
        status = hb.health.status
        health_changed = (
            node.health != status or node.devices != devices or node.provisioning != hb.provisioning
        )
        if health_changed:
            node.health = status
            node.devices = devices
            node.provisioning = hb.provisioning
        needs_inventory = node.inventory_hash != hb.inventory_hash
        clamped = interval != announced
        if not (needs_inventory or health_changed or came_back or clamped):
            return APPLIED
        return HeartbeatOutcome(
            True, needs_inventory, health_changed, came_back, interval_clamped=clamped
        )

    def _boot(
        self, node: NodeLiveness, hb: Heartbeat, interval: int, now: int
    ) -> HeartbeatOutcome | None:
        """Apply bootId/seq; an outcome when the heartbeat must be ignored."""
        if hb.boot_id == node.boot_id or not node.boot_id:
            if hb.boot_id == node.boot_id and hb.seq <= node.seq:
                return HeartbeatOutcome(True, ignored="stale_seq")
            node.boot_id, node.seq = hb.boot_id, hb.seq
            return None
        if hb.boot_id != node.prev_boot:
            # A new boot (reboot, agent restart): its sequence starts over.
            node.prev_boot, node.prev_seq = node.boot_id, node.seq
            node.boot_id, node.seq = hb.boot_id, hb.seq
            node.rival_until = None
            return None
        if hb.seq <= node.prev_seq:
            return HeartbeatOutcome(True, ignored="stale_seq")  # a replay of the old boot
        node.prev_seq = hb.seq
        if now - node.last_seen > self.window_ms(node.interval_ms):
            # The boot we followed fell silent: the other one is this node now.
            node.prev_boot, node.prev_seq, node.boot_id, node.seq = (
                node.boot_id, node.seq, hb.boot_id, hb.seq,
            )  # fmt: skip
            node.rival_until = None
            return None
        new_episode = node.rival_until is None or now > node.rival_until
        node.rival_until = now + self.window_ms(interval)
        duplicate = (node.boot_id, hb.boot_id) if new_episode else None
        return HeartbeatOutcome(True, ignored="duplicate_id", duplicate=duplicate)

    def is_rival(self, node_id: str, boot_id: str, now: int) -> bool:
        """Whether `boot_id` is the other host of a live duplicate-id episode."""
        node = self.nodes.get(node_id)
        return (
            node is not None
            and node.rival_until is not None
            and now <= node.rival_until
            and boot_id == node.prev_boot
        )

    def take_unflushed(self) -> dict[str, tuple[int, int]]:
        batch, self.unflushed = self.unflushed, {}
        return batch

    def expired(self, now: int) -> list[str]:
        """Nodes silent for misses × their interval, each past its own quiet window."""
        if not self.bus_connected:
            return []
        return [
            n.node_id
            for n in self.nodes.values()
            if n.reachable
            and now > n.quiet_until
            and now - n.last_seen > self.window_ms(n.interval_ms)
        ]

    def sweep(self, now: int) -> SweepResult:
        """`expired`, unless that is a large fraction of the fleet at once (our outage)."""
        expired = self.expired(now)
        reachable = sum(1 for n in self.nodes.values() if n.reachable)
        mass = len(expired) >= self.outage_min_nodes and len(expired) > (
            self.outage_fraction * reachable
        )
        if not mass:
            return SweepResult(tuple(expired))
        if now < self.believe_until:
            self.believe_until = 0
            return SweepResult(tuple(expired), believed=True)
        longest = max(self.window_ms(self.nodes[n].interval_ms) for n in expired)
        self.rearm(now)
        self.believe_until = now + 2 * longest
        return SweepResult(held=len(expired))

    def ages_s(self, now: int) -> list[float]:
        """Seconds since the last heartbeat of every reachable node."""
        return [(now - n.last_seen) / 1000 for n in self.nodes.values() if n.reachable]

    def mark_unreachable(self, node_ids: list[str] | tuple[str, ...]) -> None:
        for node_id in node_ids:
            node = self.nodes.get(node_id)
            if node is not None:
                node.reachable = False
                node.back_since = None
