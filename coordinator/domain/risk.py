"""At-risk reservations (SPEC §5 "Truth under change"), pure.

A live reservation is at risk while any of its atoms is held out of service: its node
unreachable, in maintenance (or held there for a pending pool move), held in
provisioning (for exceeding its expected shape, or as its agent says), the atom no
longer a current form of its device (reconfigured) or unhealthy. Every hold is one of
the rollup's buckets other than allocatable, so a booked atom is at risk exactly when
the rollup leaves its booking out of `allocated`/`reserved` (SPEC §2, §5). Its holder
is told when it becomes at risk and when it recovers; while it stays at risk its reason
and atoms follow the fleet, its `since` does not.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal, get_args

from coordinator.domain.model import NodeState
from coordinator.domain.reservation import AtRisk
from coordinator.domain.states import node_bucket

# Every reason an `atRisk` may give, weightiest first: the one a reservation is given
# when its atoms have several (the rollup's bucket precedence, atom-level causes after
# node-level ones). `pool memory short` is pool memory's own (`domain/pool_memory.py`):
# the pool promised more than its nodes have, with none of them out of service.
AtRiskReason = Literal[
    "unreachable", "pool change pending", "maintenance", "shape", "provisioning",
    "reconfigured", "unhealthy", "pool memory short",
]  # fmt: skip
AT_RISK_REASONS: tuple[AtRiskReason, ...] = get_args(AtRiskReason)
PRECEDENCE: tuple[AtRiskReason, ...] = AT_RISK_REASONS
UNREACHABLE: Final[AtRiskReason] = "unreachable"
POOL_CHANGE_PENDING: Final[AtRiskReason] = "pool change pending"
MAINTENANCE: Final[AtRiskReason] = "maintenance"
SHAPE: Final[AtRiskReason] = "shape"
PROVISIONING: Final[AtRiskReason] = "provisioning"
RECONFIGURED: Final[AtRiskReason] = "reconfigured"
UNHEALTHY: Final[AtRiskReason] = "unhealthy"
POOL_MEMORY_SHORT: Final[AtRiskReason] = "pool memory short"
_FAULTY = frozenset({"unhealthy", "unmonitored"})


@dataclass(frozen=True, slots=True)
class AtomCondition:
    """What the ledger knows of one booked atom's node and device."""

    node: NodeState
    held_for_pool_change: bool
    health: str
    retired: bool
    # Held in provisioning by the coordinator for exceeding an expected shape.
    held_for_shape: bool = False


def node_risk(
    node: NodeState, held_for_pool_change: bool, held_for_shape: bool
) -> AtRiskReason | None:
    """Why a node's whole capacity is out of service (a hold of one of the rollup's
    buckets other than allocatable), or None while it is in service (a degraded node is
    a warning, not a hold)."""
    bucket = node_bucket(node)
    if bucket == "unreachable":
        return UNREACHABLE
    if bucket == "maintenance":
        return POOL_CHANGE_PENDING if held_for_pool_change else MAINTENANCE
    if bucket == "provisioning":
        return SHAPE if held_for_shape else PROVISIONING
    if bucket == "unhealthy":
        return UNHEALTHY
    return None


def atom_risk(c: AtomCondition) -> AtRiskReason | None:
    """Why a booked atom is at risk, or None while it is in service."""
    reason = node_risk(c.node, c.held_for_pool_change, c.held_for_shape)
    if reason not in (None, UNHEALTHY):
        return reason
    if c.retired:
        return RECONFIGURED
    if reason == UNHEALTHY or c.health in _FAULTY:
        return UNHEALTHY
    return None


def assess(reasons: Mapping[str, str | None], before: AtRisk | None, now: int) -> AtRisk | None:
    """A reservation's at-risk flag from its atoms' reasons (atomId → reason or None)."""
    hit = {atom: reason for atom, reason in reasons.items() if reason is not None}
    if not hit:
        return None
    reason = min(hit.values(), key=PRECEDENCE.index)
    return AtRisk(reason, before.since if before else now, tuple(sorted(hit)))


@dataclass(frozen=True, slots=True)
class RiskChange:
    """A reservation became at risk (`at_risk` set) or recovered (`at_risk` None)."""

    reservation_id: str
    tenant_id: str
    pool_id: str
    node_id: str  # the node the alert is about: the first atom at risk, or that was
    at_risk: AtRisk | None
    before: AtRisk | None
