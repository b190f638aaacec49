"""What one poll concluded, handed from the poller to the publisher (latest wins)."""

from __future__ import annotations

import msgspec

from shared.wire import DeviceHealth, DeviceUse, Inventory, NodeHealth, OwnerMemory


class AgentState(msgspec.Struct, frozen=True):
    inventory: Inventory
    health: NodeHealth
    devices: tuple[DeviceHealth, ...]
    polled_at: float  # monotonic seconds, so the publisher can tell a stalled poll
    # The use of every GPU and MIG instance as read (`agent.usage`), not yet settled.
    use: tuple[DeviceUse, ...] = ()
    # The host memory of those processes' owners (`agent.cgroup_memory`), as read.
    memory: tuple[OwnerMemory, ...] = ()
