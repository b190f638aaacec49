"""At-risk reservations (SPEC §5 "Truth under change"), pure.

A live reservation is at risk while any of its atoms is unreachable, in maintenance
(or held there for a pending pool move), no longer a current form of its device
(reconfigured) or unhealthy. Its holder is told when it becomes at risk and when it
recovers; while it stays at risk its reason and atoms follow the fleet, its `since`
does not.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from coordinator.domain.model import NodeState
from coordinator.domain.reservation import AtRisk
from coordinator.domain.states import node_bucket

UNREACHABLE = "unreachable"
POOL_CHANGE_PENDING = "pool change pending"
MAINTENANCE = "maintenance"
RECONFIGURED = "reconfigured"
UNHEALTHY = "unhealthy"
# Weightiest first: the reason a reservation is given when its atoms have several.
PRECEDENCE: tuple[str, ...] = (UNREACHABLE, POOL_CHANGE_PENDING, MAINTENANCE, RECONFIGURED,
                               UNHEALTHY)  # fmt: skip
_FAULTY = frozenset({"unhealthy", "unmonitored"})


@dataclass(frozen=True, slots=True)
class AtomCondition:
    """What the ledger knows of one booked atom's node and device."""

    node: NodeState
    held_for_pool_change: bool
    health: str
    retired: bool


def atom_risk(c: AtomCondition) -> str | None:
    """Why a booked atom is at risk, or None while it is in service (a provisioning or
    degraded node is not a risk to what it holds)."""
    bucket = node_bucket(c.node)
    if bucket == "unreachable":
        return UNREACHABLE
    if bucket == "maintenance":
        return POOL_CHANGE_PENDING if c.held_for_pool_change else MAINTENANCE
    if c.retired:
        return RECONFIGURED
    if bucket == "unhealthy" or c.health in _FAULTY:
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
