"""Risk and rollup agree for every hold (SPEC §2, §5 "every hold puts bookings at risk
alike", issue 31): a booked atom is at risk exactly when the rollup puts it outside the
allocatable bucket (so its booking leaves `allocated`/`reserved`), its reason names the
bucket it went to, and an interval reservation relying on the node's memory is given
the same reason as a device booking on it. (Before: a node held in provisioning, for
its expected shape or by its agent, took its atoms out of the rollup while their
reservations stayed `atRisk: none`; pool memory called a shape hold `provisioning`.)"""

from __future__ import annotations

from typing import get_args

from hypothesis import given
from hypothesis import strategies as st

from coordinator.domain import pool_memory
from coordinator.domain.model import AtomView, NodeState, NodeView
from coordinator.domain.risk import (
    AT_RISK_REASONS,
    AtomCondition,
    assess,
    atom_risk,
)
from coordinator.domain.rollup import compute_rollup
from shared.wire import HealthStatus

# The bucket each node-level reason is the hold of.
BUCKET_OF = {
    "unreachable": "unreachable",
    "pool change pending": "maintenance",
    "maintenance": "maintenance",
    "shape": "provisioning",
    "provisioning": "provisioning",
    "unhealthy": "unhealthy",
}
HEALTH = st.sampled_from(get_args(HealthStatus))


@st.composite
def held_nodes(draw: st.DrawFn) -> tuple[NodeState, bool, bool]:
    """A node's flags as the ledger can hold them: a pool move is a maintenance hold
    (`pool_moves.reported`), a shape hold a provisioning one (`shapes.judged`)."""
    state = NodeState(draw(st.booleans()), draw(HEALTH), draw(st.booleans()), draw(st.booleans()))
    moving = state.maintenance and draw(st.booleans())
    shaped = state.provisioning and draw(st.booleans())
    return state, moving, shaped


def _node(state: NodeState, atom_health: HealthStatus) -> NodeView:
    gpu = AtomView("n:gpu:G0", "n", "gpu", "G0", atom_health)
    return NodeView("n", "p", state, (gpu,), memory_gib=512)


@given(held_nodes(), HEALTH)
def test_a_booked_atom_is_at_risk_exactly_when_the_rollup_takes_it_out(
    node: tuple[NodeState, bool, bool], atom_health: HealthStatus
) -> None:
    state, moving, shaped = node
    reason = atom_risk(AtomCondition(state, moving, atom_health, False, shaped))
    rows = compute_rollup([_node(state, atom_health)], None, 0)
    assert (reason is None) == (rows["gpu"].allocatable == 1)
    assert reason is None or reason in AT_RISK_REASONS
    # A node-level hold moves the memory with the atom, under the same reason.
    memory = pool_memory.out_of_service(state, moving, shaped)
    assert (memory is None) == (rows["memoryGiB"].allocatable == 512)
    if memory is not None:
        assert memory == reason
        bucket = next(b for b in BUCKET_OF.values() if getattr(rows["memoryGiB"], b) == 512)
        assert BUCKET_OF[memory] == bucket


@given(held_nodes(), HEALTH)
def test_a_reconfigured_atom_is_at_risk_whatever_its_node(
    node: tuple[NodeState, bool, bool], atom_health: HealthStatus
) -> None:
    state, moving, shaped = node
    assert atom_risk(AtomCondition(state, moving, atom_health, True, shaped)) is not None


def test_every_hold_has_its_own_reason() -> None:
    """One reason per kind of hold, the shape hold's apart from the agent's own."""
    cases = {
        "unreachable": (NodeState(reachable=False, provisioning=False), False, False),
        "pool change pending": (NodeState(maintenance=True, provisioning=False), True, False),
        "maintenance": (NodeState(maintenance=True, provisioning=False), False, False),
        "shape": (NodeState(provisioning=True), False, True),
        "provisioning": (NodeState(provisioning=True), False, False),
        "unhealthy": (NodeState(health="unhealthy", provisioning=False), False, False),
    }
    for want, (state, moving, shaped) in cases.items():
        assert atom_risk(AtomCondition(state, moving, "healthy", False, shaped)) == want
        assert pool_memory.out_of_service(state, moving, shaped) == want
    # Weightiest first: a shape hold outweighs the agent's own provisioning and a
    # device fault, maintenance outweighs it.
    both = {"a": "shape", "b": "unhealthy", "c": "provisioning"}
    risk = assess(both, None, 5)
    assert risk is not None and risk.reason == "shape"
    risk = assess(both | {"d": "maintenance"}, None, 5)
    assert risk is not None and risk.reason == "maintenance"
