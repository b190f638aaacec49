"""Which rollup bucket a node or atom falls in, with the SPEC's precedence.

unreachable > maintenance > provisioning > unhealthy; a node-level state moves every atom
of the node, a device-level fault only that device's atoms. `degraded` (thermal or power
slowdown) stays allocatable: it is a warning, never unhealthy on its own. `unmonitored`
(NVML did not start) is never silently healthy, so it counts as unhealthy.
"""

from __future__ import annotations

from coordinator.domain.model import (
    AtomView,
    GpuState,
    NodeState,
    NodeStatus,
    RollupBucket,
    UseState,
)
from shared.wire import HealthStatus

_FAULTY: frozenset[HealthStatus] = frozenset({"unhealthy", "unmonitored"})


def node_bucket(state: NodeState) -> RollupBucket:
    if not state.reachable:
        return "unreachable"
    if state.maintenance:
        return "maintenance"
    if state.provisioning:
        return "provisioning"
    if state.health in _FAULTY:
        return "unhealthy"
    return "allocatable"


def atom_bucket(state: NodeState, atom: AtomView) -> RollupBucket:
    bucket = node_bucket(state)
    if bucket != "allocatable":
        return bucket
    if atom.health in _FAULTY:
        return "unhealthy"
    return "allocatable"


def node_status(state: NodeState) -> NodeStatus:
    """One word for listings: the bucket, or `degraded`/`ready` when allocatable."""
    bucket = node_bucket(state)
    if bucket != "allocatable":
        return bucket
    return "degraded" if state.health == "degraded" else "ready"


def gpu_state(bucket: RollupBucket, held: bool) -> GpuState:
    """A GPU unit in one word: its bucket when out of service, else held or free."""
    if bucket != "allocatable":
        return bucket
    return "held" if held else "free"


def use_state(reported: bool, in_use: bool, held: bool) -> UseState | None:
    """What a unit runs: nothing reported (None), idle, busy, or unbooked (busy and
    nobody holds it)."""
    if not reported:
        return None
    if not in_use:
        return "idle"
    return "busy" if held else "unbooked"
