"""The pure rules of truth under change: pool moves as flags, what makes a reservation
at risk and with which reason, device reconfiguration as a transition, and the claim
rows the database compares."""

from __future__ import annotations

from coordinator.domain import pool_moves
from coordinator.domain.claims import WHOLE_NODE, Claim, ClaimRow, claim_rows, merged_rows
from coordinator.domain.model import NodeState
from coordinator.domain.reservation import AtRisk
from coordinator.domain.risk import AtomCondition, assess, atom_risk
from coordinator.domain.transitions import NodeFlags, node_transitions

OK = NodeState(provisioning=False)


def test_a_move_waits_for_bookings_and_is_one_transition_each_way() -> None:
    before = NodeFlags("A")
    held = pool_moves.reported(before, "B", holds_bookings=True)
    assert (held.pool_id, held.pending_pool, held.maintenance) == ("A", "B", True)
    assert [t.kind for t in node_transitions(before, held)] == ["node.poolChangePending"]
    moved = pool_moves.moved(held)
    assert (moved.pool_id, moved.pending_pool, moved.maintenance) == ("B", None, False)
    assert [t.kind for t in node_transitions(held, moved)] == ["node.poolChanged"]
    assert pool_moves.reported(before, "B", holds_bookings=False).pool_id == "B"


def test_an_operators_maintenance_survives_the_move_and_cannot_release_the_hold() -> None:
    held = pool_moves.reported(NodeFlags("A"), "B", holds_bookings=True)
    assert pool_moves.switched(held, False, "", "ops").maintenance
    mine = pool_moves.switched(held, True, "swap PSU", "ops")
    assert pool_moves.moved(mine).maintenance_reason == "swap PSU"
    cancelled = pool_moves.reported(held, "A", holds_bookings=True)
    assert (cancelled.pending_pool, cancelled.maintenance) == (None, False)
    assert [t.kind for t in node_transitions(held, cancelled)] == ["node.maintenanceEnded"]


def test_reconfiguration_is_a_device_transition() -> None:
    before = NodeFlags("A", forms={"G0": frozenset({"g0"}), "G1": frozenset({"g1"})})
    after = NodeFlags("A", forms={"G0": frozenset({"s0", "s1"}), "G1": frozenset({"g1"})})
    assert [(t.kind, t.device_id) for t in node_transitions(before, after)] == [
        ("device.reconfigured", "G0")
    ]


def _c(node: NodeState = OK, *, held: bool = False, health: str = "healthy",
       retired: bool = False) -> AtomCondition:  # fmt: skip
    return AtomCondition(node, held, health, retired)


def test_the_weightiest_reason_names_the_risk_and_since_holds() -> None:
    assert atom_risk(_c()) is None
    assert atom_risk(_c(NodeState(health="degraded", provisioning=False))) is None
    assert atom_risk(_c(NodeState(reachable=False, maintenance=True))) == "unreachable"
    assert atom_risk(_c(NodeState(maintenance=True), held=True)) == "pool change pending"
    assert atom_risk(_c(retired=True, health="unhealthy")) == "reconfigured"
    assert atom_risk(_c(health="unmonitored")) == "unhealthy"
    first = assess({"a": "unhealthy", "b": None}, None, 10)
    assert first == AtRisk("unhealthy", 10, ("a",))
    worse = assess({"a": "unhealthy", "b": "maintenance"}, first, 20)
    assert worse == AtRisk("maintenance", 10, ("a", "b"))
    assert assess({"a": None}, worse, 30) is None


def test_claim_rows_of_whole_part_and_node() -> None:
    node = ClaimRow("", "*", False, "node")
    assert claim_rows(Claim("G0"), "f") == (node, ClaimRow("G0", "*", True, "f"))
    assert claim_rows(Claim("G0", "m1"), "f") == (
        node, ClaimRow("G0", "*", False, "f"), ClaimRow("G0", "m1", True, "f"),
    )  # fmt: skip
    # A whole-node booking's own devices do not share the node with it.
    rows = merged_rows([*claim_rows(WHOLE_NODE, "node"), *claim_rows(Claim("G0"), "f")])
    assert rows == [ClaimRow("", "*", True, "node"), ClaimRow("G0", "*", True, "f")]
