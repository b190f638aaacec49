"""How often one GPU may raise an alert (issue 32), pure: the join says `gpu.unbookedUse`
and `gpu.foreignUse` once per condition, but a workload that starts and stops short
processes makes new conditions as fast as it likes. Each (node, unit) has a bucket of
`Policy.unit_alert_burst` alerts, refilled by one every `Policy.unit_alert_every_ms`;
a condition's start that finds it empty is held, and when the next alert is due every
start still held is said (the latest of each condition: at most one per owner, and a
unit has at most `MAX_OWNERS_PER_UNIT`), its `details.repeats` counting the starts held
on the unit, `details.heldSince` when the first of them happened.

Use is a condition (issue 34): a start said is ended by its end (`gpu.unbookedUseEnded`,
`gpu.foreignUseEnded`), which is never held and costs no token, so Alertmanager never
keeps firing what is over. The end of a start still held takes the start back: nothing
was said, so nothing is ended, and Alertmanager is never told of use already over (its
churn is counted in the next start said on the unit). The reservation kinds pass as they
are: one reservation's idleness is one condition, not a stream.

A bucket is forgotten once full with nothing held, so the gates held are those of
units that alerted lately: bounded by the inventory. A new leader starts them afresh
(a start the old leader held was never said, so the new one says it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from coordinator.domain.gpu_use_join import UseTransition
from coordinator.domain.gpu_use_units import Policy
from coordinator.domain.intervals import format_time

UNIT_KINDS = frozenset({"gpu.unbookedUse", "gpu.foreignUse"})
END_KINDS = {"gpu.unbookedUseEnded": "gpu.unbookedUse", "gpu.foreignUseEnded": "gpu.foreignUse"}

Key = tuple[str, str]  # (node, unit)


@dataclass(frozen=True, slots=True)
class Gate:
    tokens: float  # alerts the unit may still say, as of `at`
    at: int
    held: tuple[UseTransition, ...] = ()  # the latest start of each condition not said
    repeats: int = 0  # starts held since `since`
    since: int = 0


def condition(t: UseTransition) -> tuple[str, str, str]:
    """Which condition of its unit a start or an end is: its kind, and for foreign use
    its owner (two owners on one GPU are two conditions)."""
    kind = END_KINDS.get(t.kind, t.kind)
    if kind == "gpu.foreignUse":
        return kind, str(t.details.get("ownerKind", "")), str(t.details.get("owner", ""))
    return kind, "", ""


def _refilled(gate: Gate | None, now: int, policy: Policy) -> Gate:
    burst = float(policy.unit_alert_burst)
    if gate is None:
        return Gate(burst, now)
    grown = (now - gate.at) / policy.unit_alert_every_ms if now > gate.at else 0.0
    return replace(gate, tokens=min(burst, gate.tokens + grown), at=now)


def _aggregate(held: UseTransition, gate: Gate, policy: Policy) -> UseTransition:
    if gate.repeats <= 1:
        return held
    minutes = max(1, policy.unit_alert_every_ms // 60_000)
    reason = (
        f"{held.reason} (one of {gate.repeats} use alerts held on this GPU since"
        f" {format_time(gate.since)}: at most one round every {minutes} min)"
    )
    details = {**held.details, "repeats": gate.repeats, "heldSince": gate.since}
    return replace(held, reason=reason, details=details)


def gate(
    gates: Mapping[Key, Gate], transitions: Iterable[UseTransition], now: int, policy: Policy
) -> tuple[dict[Key, Gate], list[UseTransition]]:
    """The transitions to say now (held starts said when their unit's next alert is
    due), and the gates after them."""
    state = dict(gates)
    out: list[UseTransition] = []
    for t in transitions:
        if (t.kind not in UNIT_KINDS and t.kind not in END_KINDS) or t.device_id is None:
            out.append(t)
            continue
        key = (t.node_id, t.device_id)
        g = _refilled(state.get(key), now, policy)
        cond = condition(t)
        if t.kind in END_KINDS:
            kept = tuple(h for h in g.held if condition(h) != cond)
            if len(kept) == len(g.held):
                out.append(t)  # its start was said: end it
            state[key] = replace(g, held=kept)
        elif not g.held and g.tokens >= 1:
            state[key] = replace(g, tokens=g.tokens - 1)
            out.append(t)
        else:
            first = g.since if g.repeats else now
            kept = (*(h for h in g.held if condition(h) != cond), t)
            state[key] = replace(g, held=kept, repeats=g.repeats + 1, since=first)
    for key, old in list(state.items()):
        g = _refilled(old, now, policy)
        if g.held and g.tokens >= 1:
            out.extend(_aggregate(h, g, policy) for h in g.held)
            g = Gate(g.tokens - 1, now)
        if not g.held and g.tokens >= policy.unit_alert_burst:
            del state[key]
        else:
            state[key] = g
    return state, out
