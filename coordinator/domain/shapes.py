"""Expected node shapes (SPEC §4, issue 23), pure: an operator says how many atoms of
each class a pool's nodes, or a host profile's, should have (`{"gpu": 8, "nic.vf":
32}`). A node whose inventory has MORE than a shape that applies to it is held in
`provisioning`, with the reason, until an operator accepts it; accepting records the
counts it had then, so the same inventory is not held again, but one that grows past
what was accepted is. Fewer than expected is the agent's concern (its expected
inventory turns a shortfall into `missing` devices), never a hold here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from coordinator.domain.transitions import NodeFlags
from shared.wire import Inventory

# Placeholder atoms of devices the host does not show stand for absence.
_PLACEHOLDER = "missing:"
HOLD_PREFIX = "inventory exceeds the expected shape"

Shape = Mapping[str, int]


@dataclass(frozen=True, slots=True)
class ExpectedShape:
    """Atom counts per class expected of a pool's nodes (`profile_id` "") or of a host
    profile version's (`pool_id` "")."""

    pool_id: str
    profile_id: str
    profile_version: int
    counts: Mapping[str, int]
    updated_at: int
    updated_by: str


def counts_of(inv: Inventory) -> dict[str, int]:
    """Atoms per class the inventory offers (placeholders for absent devices aside)."""
    counted = Counter(a.cls for a in inv.atoms if not a.device_id.startswith(_PLACEHOLDER))
    return dict(sorted(counted.items()))


def excess(counts: Shape, expected: Shape) -> list[str]:
    """`gpu 9 > 8` for each class of `expected` the counts exceed, by class name."""
    return [
        f"{cls} {counts.get(cls, 0)} > {limit}"
        for cls, limit in sorted(expected.items())
        if counts.get(cls, 0) > limit
    ]


def covered(counts: Shape, accepted: Shape | None) -> bool:
    """Whether an operator already accepted this much of every class."""
    return accepted is not None and all(n <= accepted.get(cls, 0) for cls, n in counts.items())


def hold_reason(counts: Shape, shapes: Iterable[Shape], accepted: Shape | None) -> str:
    """Why the node is held ("" when it is not): it exceeds a shape that applies to it
    (its pool's, its profile's) and no operator accepted as much."""
    over = sorted({item for shape in shapes for item in excess(counts, shape)})
    if not over or covered(counts, accepted):
        return ""
    return f"{HOLD_PREFIX}: {', '.join(over)}"


def judged(flags: NodeFlags, reason: str) -> NodeFlags:
    """The flags with the hold `reason` applied, `flags.provisioning` being what the
    agent said last: provisioning while held (for its shape or a duplicate device), else
    as the agent says."""
    held = bool(reason) or bool(flags.duplicate_hold)
    return replace(flags, shape_hold=reason, provisioning=flags.provisioning or held)
