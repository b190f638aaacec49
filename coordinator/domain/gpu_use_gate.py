"""How often one GPU may raise an alert (issue 32), pure: the join says `gpu.unbookedUse`
and `gpu.foreignUse` once per condition, but a workload that starts and stops short
processes makes new conditions as fast as it likes. Each (node, unit) has a bucket of
`Policy.unit_alert_burst` alerts, refilled by one every `Policy.unit_alert_every_ms`;
a transition that finds it empty is held, and the held ones are said as one alert, the
latest of them, when the next is due: its `details.repeats` counts the transitions it
stands for, `details.heldSince` when the first of them happened. A unit therefore
makes at most `burst` alerts (and node events) at once and one per period after
that, however its processes churn. The reservation kinds pass as they are: one
reservation's idleness is one condition, not a stream.

A bucket is forgotten once full with nothing held, so the gates held are those of
units that alerted lately: bounded by the inventory. A new leader starts them afresh,
like the join's marks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from coordinator.domain.gpu_use_join import Policy, UseTransition
from coordinator.domain.intervals import format_time

UNIT_KINDS = frozenset({"gpu.unbookedUse", "gpu.foreignUse"})

Key = tuple[str, str]  # (node, unit)


@dataclass(frozen=True, slots=True)
class Gate:
    tokens: float  # alerts the unit may still say, as of `at`
    at: int
    held: UseTransition | None = None  # the latest transition not said
    repeats: int = 0  # transitions held since `since`
    since: int = 0


def _refilled(gate: Gate | None, now: int, policy: Policy) -> Gate:
    burst = float(policy.unit_alert_burst)
    if gate is None:
        return Gate(burst, now)
    grown = (now - gate.at) / policy.unit_alert_every_ms if now > gate.at else 0.0
    return replace(gate, tokens=min(burst, gate.tokens + grown), at=now)


def _aggregate(gate: Gate, policy: Policy) -> UseTransition:
    held = gate.held
    assert held is not None
    if gate.repeats <= 1:
        return held
    minutes = max(1, policy.unit_alert_every_ms // 60_000)
    reason = (
        f"{held.reason} (the last of {gate.repeats} use alerts on this GPU since"
        f" {format_time(gate.since)}, said as one: at most one every {minutes} min)"
    )
    details = {**held.details, "repeats": gate.repeats, "heldSince": gate.since}
    return replace(held, reason=reason, details=details)


def gate(
    gates: Mapping[Key, Gate], transitions: Iterable[UseTransition], now: int, policy: Policy
) -> tuple[dict[Key, Gate], list[UseTransition]]:
    """The transitions to say now (held ones said as one when their unit's next alert
    is due), and the gates after them."""
    state = dict(gates)
    out: list[UseTransition] = []
    for t in transitions:
        if t.kind not in UNIT_KINDS or t.device_id is None:
            out.append(t)
            continue
        key = (t.node_id, t.device_id)
        g = _refilled(state.get(key), now, policy)
        if g.held is None and g.tokens >= 1:
            state[key] = replace(g, tokens=g.tokens - 1)
            out.append(t)
        else:
            first = g.since if g.held is not None else now
            state[key] = replace(g, held=t, repeats=g.repeats + 1, since=first)
    for key, old in list(state.items()):
        g = _refilled(old, now, policy)
        if g.held is not None and g.tokens >= 1:
            out.append(_aggregate(g, policy))
            g = Gate(g.tokens - 1, now)
        if g.held is None and g.tokens >= policy.unit_alert_burst:
            del state[key]
        else:
            state[key] = g
    return state, out
