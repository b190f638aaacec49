"""Pool-wide memory under change (SPEC §5 "Truth under change"), pure.

Interval reservations promise a pool's memory, not a node's: what they rely on is the
memory of the pool's nodes in service (the allocatable bucket), less what node-level
bookings on those nodes hold. Two questions follow, answered with the one arithmetic of
`commitments` (the peak at the busiest instant):

- whether a node may leave the pool (a pool move) — not while the pool's future
  commitments, pool-wide and node-level on the other nodes in service, exceed what
  those other nodes have: then the node is held like one with bookings of its own;
- whether an interval reservation is at risk — while, in a quarter it holds, the pool's
  commitments exceed the memory in service. Its reason is the weightiest of the nodes
  whose memory left service (`risk.PRECEDENCE`: the same reasons a device booking on
  them is given, a shape hold's included), or `pool memory short` when none did.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from coordinator.domain.commitments import Commitment, Profile
from coordinator.domain.model import NodeState
from coordinator.domain.risk import POOL_MEMORY_SHORT, PRECEDENCE, node_risk

# When the memory the pool promised is short and no node of the pool is out of service
# to blame (the nodes left it): the reservation is at risk all the same.
SHORT = POOL_MEMORY_SHORT


def needs_node(commitments: Iterable[Commitment], memory_without: int, now: int) -> bool:
    """Whether the pool still needs a node's memory: its commitments from `now` on
    (pool-wide, and node-level on its other nodes in service) peak above
    `memory_without`, the memory its other nodes in service have."""
    held = [c for c in commitments if c.end > now]
    if not held:
        return False
    return Profile.of(held).peak(now, max(c.end for c in held)) > memory_without


@dataclass(frozen=True, slots=True)
class OutOfService:
    """A node of the pool whose memory is not allocatable, and why (a risk reason)."""

    node_id: str
    reason: str


def out_of_service(
    state: NodeState, held_for_pool_change: bool, held_for_shape: bool
) -> str | None:
    """Why a node's memory is not in service (None: it is), as a device booking on the
    node would be told."""
    return node_risk(state, held_for_pool_change, held_for_shape)


def short_windows(
    commitments: Iterable[Commitment], in_service: int, windows: Sequence[tuple[int, int]]
) -> list[bool]:
    """For each window: whether the pool's commitments peak above the memory in service."""
    profile = Profile.of(commitments)
    return [profile.peak(start, end) > in_service for start, end in windows]


def blame(out: Iterable[OutOfService]) -> tuple[str, tuple[str, ...]]:
    """The reason a pool-wide reservation is at risk, and the nodes out of service."""
    nodes = sorted(out, key=lambda o: o.node_id)
    if not nodes:
        return SHORT, ()
    reason = min((o.reason for o in nodes), key=PRECEDENCE.index)
    return reason, tuple(o.node_id for o in nodes)
