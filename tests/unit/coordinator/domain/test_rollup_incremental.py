"""Incremental rollup deltas agree with a rebuild from scratch, whatever the events."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.domain.model import AtomView, NodeState, NodeView
from coordinator.domain.rollup import apply_delta, compute_rollup, rollup_delta

HEALTH = st.sampled_from(["healthy", "degraded", "unhealthy", "unmonitored"])


@st.composite
def nodes(draw: st.DrawFn, node_id: str) -> NodeView:
    gpus = draw(st.integers(0, 8))
    migs = draw(st.integers(0, 7))
    atoms = [AtomView(f"{node_id}:node", node_id, "node", "")]
    atoms += [
        AtomView(f"{node_id}:g{i}", node_id, "gpu", f"g{i}", draw(HEALTH)) for i in range(gpus)
    ]
    atoms += [
        AtomView(f"{node_id}:m{i}", node_id, "gpu.mig", "gm", draw(HEALTH)) for i in range(migs)
    ]
    state = NodeState(draw(st.booleans()), draw(HEALTH), draw(st.booleans()), draw(st.booleans()))
    return NodeView(
        node_id, "p", state, tuple(atoms),
        vcpu=draw(st.integers(0, 256)), memory_gib=draw(st.integers(0, 2048)),
        hugepages_1gi=draw(st.integers(0, 16)),
    )  # fmt: skip


@st.composite
def event(draw: st.DrawFn, node: NodeView) -> NodeView | None:
    kind = draw(st.sampled_from(["reach", "health", "maint", "prov", "device", "remove", "new"]))
    s = node.state
    if kind == "reach":
        return replace(node, state=replace(s, reachable=not s.reachable))
    if kind == "health":
        return replace(node, state=replace(s, health=draw(HEALTH)))
    if kind == "maint":
        return replace(node, state=replace(s, maintenance=not s.maintenance))
    if kind == "prov":
        return replace(node, state=replace(s, provisioning=not s.provisioning))
    if kind == "device" and node.atoms:
        i = draw(st.integers(0, len(node.atoms) - 1))
        atoms = list(node.atoms)
        atoms[i] = replace(atoms[i], health=draw(HEALTH))
        return replace(node, atoms=tuple(atoms))
    if kind == "remove":
        return None
    return draw(nodes(node.node_id))


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_incremental_rollup_equals_rebuilt_after_random_events(data: st.DataObject) -> None:
    fleet: dict[str, NodeView | None] = {f"n{i}": None for i in range(4)}
    rows = compute_rollup([], None, 0)
    for step in range(data.draw(st.integers(1, 40))):
        node_id = data.draw(st.sampled_from(sorted(fleet)))
        before = fleet[node_id]
        after = data.draw(event(before)) if before else data.draw(nodes(node_id))
        fleet[node_id] = after
        rows = apply_delta(rows, rollup_delta(before, after), step)
        rebuilt = compute_rollup([n for n in fleet.values() if n], None, step)
        assert {r: v.counts() for r, v in rows.items()} == {
            r: v.counts() for r, v in rebuilt.items()
        }
