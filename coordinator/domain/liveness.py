"""In-memory liveness and health of every node, fed by heartbeats (pure; `now` is passed).

Heartbeats never touch SQL one by one: the tracker keeps last-seen per node and marks
what needs writing (health changes, nodes coming back, inventories to ask for). The
coordinator's own clock decides liveness, never the agent's `sentAt` (clock skew).

Unreachable detection is suppressed while the coordinator is cut off from NATS and for
one detection window after it (re)connects or starts: silence then is our outage, not
the node's.

Hysteresis: losing a node is immediate, but an unreachable node is reachable again only
after its heartbeats have kept coming for `recovery_hold_ms` without a gap longer than
its detection window, so a flapping node yields one alert, not a storm.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.wire import DeviceHealth, HealthStatus, Heartbeat


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


@dataclass(frozen=True, slots=True)
class HeartbeatOutcome:
    known: bool
    needs_inventory: bool
    health_changed: bool
    came_back: bool


@dataclass(slots=True)
class LivenessTracker:
    misses: int = 3
    recovery_hold_ms: int = 10_000
    nodes: dict[str, NodeLiveness] = field(default_factory=dict)
    # Pending last-seen writes, flushed in one statement: nodeId → (lastSeen, intervalMs).
    unflushed: dict[str, tuple[int, int]] = field(default_factory=dict)
    # While set, nothing is marked unreachable before this time (startup / reconnect).
    quiet_until: int = 0
    bus_connected: bool = False

    def load(self, node: NodeLiveness, now: int) -> None:
        """Seed from the ledger at start; a node's clock restarts with ours."""
        node.last_seen = max(node.last_seen, now)
        self.nodes[node.node_id] = node

    def window_ms(self, interval_ms: int) -> int:
        return self.misses * interval_ms

    def max_window_ms(self) -> int:
        longest = max((n.interval_ms for n in self.nodes.values()), default=5000)
        return self.window_ms(longest)

    def bus_up(self, now: int) -> None:
        self.bus_connected = True
        self.quiet_until = now + self.max_window_ms()
        # Nodes were silent only because we were: restart their clocks.
        for node in self.nodes.values():
            node.last_seen = max(node.last_seen, now)

    def bus_down(self) -> None:
        self.bus_connected = False

    def on_heartbeat(self, hb: Heartbeat, now: int) -> HeartbeatOutcome:
        node = self.nodes.get(hb.node_id)
        if node is None or node.pool_id != hb.pool_id:
            return HeartbeatOutcome(False, True, False, False)
        came_back = False
        if not node.reachable:
            if node.back_since is None or now - node.last_seen > self.window_ms(hb.interval_ms):
                node.back_since = now
            if now - node.back_since >= self.recovery_hold_ms:
                node.reachable, node.back_since, came_back = True, None, True
        node.last_seen = now
        node.interval_ms = hb.interval_ms
        self.unflushed[hb.node_id] = (now, hb.interval_ms)
        devices = frozenset(hb.devices)
        health_changed = (
            node.health != hb.health.status
            or node.devices != devices
            or node.provisioning != hb.provisioning
        )
        node.health = hb.health.status
        node.devices = devices
        node.provisioning = hb.provisioning
        needs_inventory = node.inventory_hash != hb.inventory_hash
        return HeartbeatOutcome(True, needs_inventory, health_changed, came_back)

    def take_unflushed(self) -> dict[str, tuple[int, int]]:
        batch, self.unflushed = self.unflushed, {}
        return batch

    def expired(self, now: int) -> list[str]:
        """Nodes silent for misses × their interval, unless we are in a quiet period."""
        if not self.bus_connected or now < self.quiet_until:
            return []
        return [
            n.node_id
            for n in self.nodes.values()
            if n.reachable and now - n.last_seen > self.window_ms(n.interval_ms)
        ]

    def ages_s(self, now: int) -> list[float]:
        """Seconds since the last heartbeat of every reachable node."""
        return [(now - n.last_seen) / 1000 for n in self.nodes.values() if n.reachable]

    def mark_unreachable(self, node_ids: list[str]) -> None:
        for node_id in node_ids:
            node = self.nodes.get(node_id)
            if node is not None:
                node.reachable = False
                node.back_since = None
