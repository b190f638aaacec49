"""The use conditions open now (issue 34), pure: which `gpu.unbookedUse`,
`gpu.foreignUse` and `reservation.idle` were said and not yet ended, as the ledger keeps
them, so that a new leader judges use from where the old one left off instead of from
nothing: it neither says again what the old leader said nor misses an end.

`changes` turns the transitions a pass said into the rows to open and the keys to
close (written in the transaction that records their alerts); `state_of` turns the open
rows back into the join's marks (`gpu_use_join.JoinState`). Only what was said is kept:
a start the rate gate held (`gpu_use_gate`) was never said, so a new leader says it.
An idle clock not yet said is not kept either: a new leader starts it afresh.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from coordinator.domain.gpu_use_join import Idle, JoinState, UseTransition

# An end → the kind of the condition it ends.
ENDS = {
    "gpu.unbookedUseEnded": "gpu.unbookedUse",
    "gpu.foreignUseEnded": "gpu.foreignUse",
    "reservation.inUse": "reservation.idle",
}
STARTS = frozenset(ENDS.values())


@dataclass(frozen=True, slots=True)
class IdleLine:
    """A reservation said idle and not in use since (for the metrics)."""

    reservation_id: str
    tenant_id: str
    pool_id: str
    node_id: str
    since: int


def idle_lines(state: JoinState) -> tuple[IdleLine, ...]:
    return tuple(
        IdleLine(rid, i.tenant_id, i.pool_id, i.node_id, i.since)
        for rid, i in sorted(state.idle.items())
        if i.said and i.since is not None
    )


@dataclass(frozen=True, slots=True)
class OpenCondition:
    key: str
    kind: str  # a start kind
    pool_id: str
    node_id: str
    device_id: str = ""
    owner_kind: str = ""
    owner: str = ""
    reservation_id: str = ""
    tenant_id: str = ""
    since: int = 0


def key_of(t: UseTransition) -> str:
    """One condition's key, the same for its start and its end."""
    kind = ENDS.get(t.kind, t.kind)
    if kind == "reservation.idle":
        return f"{kind}|{t.reservation_id or ''}"
    if kind == "gpu.foreignUse":
        owner = f"{t.details.get('ownerKind', '')}|{t.details.get('owner', '')}"
        return f"{kind}|{t.node_id}|{t.device_id or ''}|{owner}"
    return f"{kind}|{t.node_id}|{t.device_id or ''}"


def changes(said: Iterable[UseTransition], now: int) -> tuple[list[OpenCondition], list[str]]:
    """The conditions these transitions (in order) open, and the keys they close."""
    opened: dict[str, OpenCondition] = {}
    closed: dict[str, None] = {}
    for t in said:
        key = key_of(t)
        if t.kind in ENDS:
            opened.pop(key, None)
            closed[key] = None
        elif t.kind in STARTS:
            closed.pop(key, None)
            since = t.details.get("idleSince") if t.kind == "reservation.idle" else None
            opened[key] = OpenCondition(
                key, t.kind, t.pool_id, t.node_id, t.device_id or "",
                str(t.details.get("ownerKind", "")) if t.kind == "gpu.foreignUse" else "",
                str(t.details.get("owner", "")) if t.kind == "gpu.foreignUse" else "",
                t.reservation_id or "", str(t.details.get("tenantId", "") or ""),
                since if isinstance(since, int) else now,
            )  # fmt: skip
    return list(opened.values()), list(closed)


def state_of(conditions: Iterable[OpenCondition]) -> JoinState:
    """The join's marks for these open conditions: each said, none to say again."""
    unbooked: set[tuple[str, str]] = set()
    foreign: set[tuple[str, str, str, str]] = set()
    idle: dict[str, Idle] = {}
    for c in conditions:
        if c.kind == "gpu.unbookedUse":
            unbooked.add((c.node_id, c.device_id))
        elif c.kind == "gpu.foreignUse":
            foreign.add((c.node_id, c.device_id, c.owner_kind, c.owner))
        elif c.kind == "reservation.idle":
            idle[c.reservation_id] = Idle(
                c.since, True, c.pool_id, c.node_id, tenant_id=c.tenant_id
            )
    return JoinState(frozenset(unbooked), frozenset(foreign), idle)
