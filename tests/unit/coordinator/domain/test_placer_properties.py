"""Properties of the placer over random small pools, random holds (on current forms, on
forms that no longer exist, on whole nodes; spot or not) and random requests: what it
returns is free of conflicting claims, NVLink picks are pairwise linked, it notices
exactly the spot holders it needs, a single-entry request that some node could take
is never refused, and a refusal says what every node alone would say."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from itertools import combinations

from hypothesis import assume, event, given, settings
from hypothesis import strategies as st

from coordinator.domain.claims import WHOLE_NODE, Claim, conflicts, stale_claim
from coordinator.domain.free_index import FreeCounts
from coordinator.domain.model import NodeState
from coordinator.domain.placement_model import (
    AtomSlot,
    DeviceRequest,
    HeldClaim,
    Holder,
    NodeSlot,
    PlacementRequest,
    PoolSnapshot,
)
from coordinator.domain.placer import place

READY = NodeState(reachable=True, health="healthy", maintenance=False, provisioning=False)
FORMS = ("whole", "mig", "slot", "whole+mig")


@dataclass(frozen=True)
class World:
    snap: PoolSnapshot
    # nodeId → pairs of GPU atom ids that share an NVLink.
    links: dict[str, set[frozenset[str]]]


@st.composite
def nodes(draw: st.DrawFn, node_id: str) -> tuple[NodeSlot, set[frozenset[str]]]:
    devices = draw(st.integers(2, 6))
    with_matrix = draw(st.booleans())
    edges = {
        (i, j)
        for i, j in combinations(range(devices), 2)
        if draw(st.booleans())  # a random link matrix, chains and all
    }
    labels = [draw(st.sampled_from(["a", "b", None])) for _ in range(devices)]
    atoms = [AtomSlot(f"{node_id}:node", "node", True, {})]
    for d in range(devices):
        device = f"G-{node_id}-{d}"
        form = draw(st.sampled_from(FORMS))
        healthy = draw(st.integers(0, 9)) > 0
        if "whole" in form:
            peers = frozenset(
                f"G-{node_id}-{j}" for i, j in edges | {(b, a) for a, b in edges} if i == d
            )
            atoms.append(
                AtomSlot(
                    f"{node_id}:gpu:{d}",
                    "gpu",
                    healthy,
                    {"nvlinkClique": labels[d]},
                    device,
                    peers if with_matrix else None,
                )
            )
        if "mig" in form:
            for k in range(draw(st.integers(1, 3))):
                atoms.append(AtomSlot(f"{node_id}:gpu.mig:{d}.{k}", "gpu.mig", healthy, {}, device))
        if form == "slot":
            for k in range(draw(st.integers(1, 3))):
                atoms.append(
                    AtomSlot(f"{node_id}:gpu.slot:{d}:{k}", "gpu.slot", healthy, {}, device)
                )
    gpus = [a for a in atoms if a.cls == "gpu"]
    links = set()
    for a, b in combinations(gpus, 2):
        i, j = int(a.atom_id.rsplit(":", 1)[1]), int(b.atom_id.rsplit(":", 1)[1])
        if with_matrix:
            linked = (min(i, j), max(i, j)) in edges
        else:
            linked = labels[i] is not None and labels[i] == labels[j]
        if linked:
            links.add(frozenset((a.atom_id, b.atom_id)))
    state = READY if draw(st.integers(0, 9)) else NodeState(False, "healthy", False, False)
    capacity = {"vcpu": 8, "memoryGiB": 64, "hugepages1Gi": 0}
    return NodeSlot(node_id, state, {}, "std", 1, tuple(atoms), capacity), links


@st.composite
def holds(draw: st.DrawFn, node: NodeSlot) -> tuple[HeldClaim, ...]:
    out = []
    for _ in range(draw(st.integers(0, 3))):
        rid = draw(st.sampled_from(["r0", "r1", "r2", "r3"]))
        spot = draw(st.integers(0, 2)) > 0
        kind = draw(st.sampled_from(["current", "current", "retired", "node"]))
        if kind == "current" and len(node.atoms) > 1:
            atom = draw(st.sampled_from(node.atoms[1:]))
            claim, atom_id = atom.claim, atom.atom_id
        elif kind == "node":
            claim, atom_id = WHOLE_NODE, f"{node.node_id}:node"
        else:
            d = draw(st.integers(0, 4))  # a device that may no longer be there at all
            atom_id = f"{node.node_id}:gpu.mig:{d}.old"
            claim = stale_claim(atom_id, "gpu.mig", f"G-{node.node_id}-{d}")
        out.append(HeldClaim(atom_id, claim, Holder(f"{rid}-{spot}", spot)))
    return tuple(out)


@st.composite
def worlds(draw: st.DrawFn) -> World:
    built = [draw(nodes(f"n{i}")) for i in range(draw(st.integers(1, 3)))]
    held = {n.node_id: draw(holds(n)) for n, _ in built}
    snap = PoolSnapshot(tuple(n for n, _ in built), held=held)
    return World(snap, {n.node_id: links for n, links in built})


entries = st.builds(
    DeviceRequest,
    cls=st.sampled_from(["gpu", "gpu", "gpu.mig", "gpu.slot"]),
    count=st.sampled_from([1, 1, 2, 2, 3]),
    topology=st.sampled_from([None, None, "nvlink-all"]),
)
requests = st.builds(
    PlacementRequest,
    devices=st.lists(entries, min_size=1, max_size=2).map(tuple),
    topology=st.sampled_from(["any", "nvlink-all"]),
    binding=st.sampled_from(["hold", "hold", "hold", "node"]),
)


def _blocking(world: World, node_id: str, ignore_spot: bool) -> list[Claim]:
    held = world.snap.held.get(node_id, ())
    return [h.claim for h in held if not (ignore_spot and h.holder.spot)]


def _free(world: World, node: NodeSlot, ignore_spot: bool) -> list[AtomSlot]:
    blocking = _blocking(world, node.node_id, ignore_spot)
    return [a for a in node.atoms if a.healthy and not any(conflicts(a.claim, c) for c in blocking)]


def _clique(world: World, node_id: str, atoms: list[AtomSlot]) -> bool:
    return all(
        frozenset((a.atom_id, b.atom_id)) in world.links[node_id] for a, b in combinations(atoms, 2)
    )


@settings(max_examples=500, deadline=None)
@given(world=worlds(), req=requests, ignore_spot=st.booleans())
def test_what_the_placer_returns_is_free_linked_and_noticed(
    world: World, req: PlacementRequest, ignore_spot: bool
) -> None:
    result = place(req, world.snap, ignore_spot=ignore_spot)
    event(f"fits={result.fits} victims={bool(result.victims)} wide={req.topology}")
    if not result.fits:
        assert result.reason and sum(result.filtered.values()) >= 0
        return
    by_id = {n.node_id: n for n in world.snap.nodes}
    for pick in result.chosen:
        node = by_id[pick.node_id]
        held = world.snap.held.get(node.node_id, ())
        atoms = list(pick.atoms)
        assert {a.atom_id for a in atoms} <= {a.atom_id for a in node.atoms}
        if req.whole_node:
            assert not _blocking(world, node.node_id, ignore_spot)
            continue
        assert len(atoms) == sum(d.count for d in req.devices)
        free = {a.atom_id for a in _free(world, node, ignore_spot)}
        assert all(a.atom_id in free for a in atoms)
        assert not any(conflicts(a.claim, b.claim) for a, b in combinations(atoms, 2))
        gpus = [a for a in atoms if a.cls == "gpu"]
        gpu_entries = [d for d in req.devices if d.cls == "gpu"]
        if req.topology == "nvlink-all" and all(d.topology != "any" for d in gpu_entries):
            assert _clique(world, node.node_id, gpus)
        if req.topology == "any" and len(gpu_entries) == 1 and gpu_entries[0].topology:
            assert _clique(world, node.node_id, gpus)
        needed = {
            h.holder.reservation_id
            for h in held
            if h.holder.spot and any(conflicts(a.claim, h.claim) for a in atoms)
        }
        assert pick.victims == (needed if ignore_spot else set())


@settings(max_examples=300, deadline=None)
@given(world=worlds(), entry=entries, wide=st.booleans(), ignore_spot=st.booleans())
def test_a_single_entry_that_some_node_can_take_is_placed(
    world: World, entry: DeviceRequest, wide: bool, ignore_spot: bool
) -> None:
    req = PlacementRequest(devices=(entry,), topology="nvlink-all" if wide else "any")
    nvlink = entry.cls == "gpu" and (entry.topology == "nvlink-all" or wide)
    possible = False
    for node in world.snap.nodes:
        if node.state != READY:
            continue
        pool = [a for a in _free(world, node, ignore_spot) if a.cls == entry.cls]
        for chosen in combinations(pool, entry.count):
            if any(conflicts(a.claim, b.claim) for a, b in combinations(chosen, 2)):
                continue
            if nvlink and not _clique(world, node.node_id, list(chosen)):
                continue
            possible = True
            break
    event(f"possible={possible} nvlink={nvlink} count={entry.count}")
    assert place(req, world.snap, ignore_spot=ignore_spot).fits == possible


@settings(max_examples=400, deadline=None)
@given(
    world=worlds(), entry=entries, second=st.none() | entries, wide=st.booleans(),
    ignore_spot=st.booleans(), indexed=st.booleans(), later=st.booleans(),
)  # fmt: skip
def test_a_refusal_answers_as_each_node_alone_would(
    world: World,
    entry: DeviceRequest,
    second: DeviceRequest | None,
    wide: bool,
    ignore_spot: bool,
    indexed: bool,
    later: bool,
) -> None:
    """Nodes counted out are judged only while one could have more free than a node
    already judged; the answer must still be what judging every node gives: each
    node's reason counted, and the most any one node has free of each entry. (`later`:
    every node also holds a whole-node booking after the window, so the free index's
    kept counts are 0 and only the window's own counts are true. `second`: a request of
    two entries, whose counted-out nodes are all judged.)"""
    devices = (entry,) if second is None else (entry, second)
    req = PlacementRequest(devices=devices, topology="nvlink-all" if wide else "any")
    snap = world.snap
    if indexed:
        after = (HeldClaim("node", WHOLE_NODE, Holder("later", False)),) if later else ()
        counts = FreeCounts(snap.nodes, lambda n: (*snap.held.get(n, ()), *after))
        irregular = frozenset(n.node_id for n in snap.nodes) if later else frozenset()
        snap = replace(snap, order=counts.window(irregular, 0, 1))
    refused = place(req, snap, ignore_spot=ignore_spot)
    assume(not refused.fits)
    alone = [
        place(req, PoolSnapshot((n,), held={n.node_id: snap.held.get(n.node_id, ())}),
              ignore_spot=ignore_spot)
        for n in snap.nodes
    ]  # fmt: skip
    event(f"nodes={len(alone)} indexed={indexed}")
    assert refused.filtered == dict(sum((Counter(a.filtered) for a in alone), Counter()))
    assert [s.available for s in refused.shortfalls] == [
        max(a.shortfalls[i].available for a in alone) for i in range(len(refused.shortfalls))
    ]
    # Each node is one refusal: a count off by one per node would pass the sums above
    # (each node alone is judged by the same code).
    assert sum(refused.filtered.values()) == len(snap.nodes)
    # Ignoring spot holders is the same pool without them, not spot-blind counting
    # followed by spot-aware judging. (One entry only: with several, preferring atoms no
    # spot holder holds can steer the greedy fit into a device's other form, where
    # the pool without them fits; the closing note of session 17 has the example.)
    if ignore_spot and second is None:
        unspotted = replace(
            snap,
            held={n: tuple(h for h in hs if not h.holder.spot) for n, hs in snap.held.items()},
            order=None,
        )
        plain = place(req, unspotted, ignore_spot=False)
        assert (plain.fits, plain.filtered, plain.shortfalls) == (
            False, refused.filtered, refused.shortfalls,
        )  # fmt: skip
