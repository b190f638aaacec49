from __future__ import annotations

from coordinator.domain.model import RESOURCES, AtomView, BookedUnits, NodeState, NodeView
from coordinator.domain.rollup import compute_rollup
from coordinator.domain.states import node_bucket


def _node(
    node_id: str,
    state: NodeState,
    gpus: int = 8,
    sick_gpus: int = 0,
    vcpu: int = 64,
) -> NodeView:
    atoms = [AtomView(f"{node_id}:node", node_id, "node", "")]
    for i in range(gpus):
        health = "unhealthy" if i < sick_gpus else "healthy"
        atoms.append(AtomView(f"{node_id}:g{i}", node_id, "gpu", f"u{i}", health))
    return NodeView(node_id, "pool", state, tuple(atoms), vcpu=vcpu, memory_gib=100)


READY = NodeState(reachable=True, health="healthy", maintenance=False, provisioning=False)


def test_every_resource_has_a_row_ordered_by_name_even_when_empty() -> None:
    rows = compute_rollup([], None, 5)
    assert list(rows) == sorted(RESOURCES)
    assert all(r.total == 0 and r.updated_at == 5 for r in rows.values())


def test_precedence_unreachable_over_maintenance_over_provisioning_over_unhealthy() -> None:
    everything = NodeState(reachable=False, health="unhealthy", maintenance=True, provisioning=True)
    assert node_bucket(everything) == "unreachable"
    assert node_bucket(NodeState(True, "unhealthy", True, True)) == "maintenance"
    assert node_bucket(NodeState(True, "unhealthy", False, True)) == "provisioning"
    assert node_bucket(NodeState(True, "unhealthy", False, False)) == "unhealthy"
    assert node_bucket(NodeState(True, "unmonitored", False, False)) == "unhealthy"
    assert node_bucket(NodeState(True, "degraded", False, False)) == "allocatable"


def test_device_fault_moves_only_that_devices_atoms() -> None:
    rows = compute_rollup([_node("a", READY, sick_gpus=2)], None, 0)
    gpu = rows["gpu"]
    assert (gpu.total, gpu.allocatable, gpu.unhealthy) == (8, 6, 2)
    assert rows["node"].allocatable == 1
    assert rows["vcpu"].allocatable == 64


def test_node_state_moves_all_atoms_and_scalars_and_wins_over_device_faults() -> None:
    down = NodeState(reachable=False, health="healthy", maintenance=False, provisioning=False)
    rows = compute_rollup([_node("a", down, sick_gpus=3), _node("b", READY)], None, 0)
    gpu = rows["gpu"]
    assert (gpu.total, gpu.allocatable, gpu.unreachable, gpu.unhealthy) == (16, 8, 8, 0)
    assert rows["vcpu"].unreachable == 64 and rows["vcpu"].allocatable == 64
    assert rows["memoryGiB"].total == 200


def test_total_is_the_sum_of_the_buckets() -> None:
    states = [
        READY,
        NodeState(True, "healthy", True, False),
        NodeState(True, "healthy", False, True),
        NodeState(True, "unhealthy", False, False),
        NodeState(False, "healthy", False, False),
    ]
    nodes = [_node(f"n{i}", s, sick_gpus=i % 3) for i, s in enumerate(states)]
    for row in compute_rollup(nodes, None, 0).values():
        assert row.total == (
            row.allocatable + row.provisioning + row.unhealthy + row.maintenance + row.unreachable
        )


def test_available_is_conservative_and_never_negative() -> None:
    booked = BookedUnits(allocated={"gpu": 5}, reserved={"gpu": 6})
    rows = compute_rollup([_node("a", READY)], booked, 0)
    assert rows["gpu"].available == 0
    booked = BookedUnits(allocated={"gpu": 2}, reserved={"gpu": 3})
    assert compute_rollup([_node("a", READY)], booked, 0)["gpu"].available == 3
