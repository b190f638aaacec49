"""What the placer tells a tenant it refuses (SPEC §5 "why not"), word for word, and
NVLink cliques from a link matrix: pairwise links, not connected components."""

from __future__ import annotations

from dataclasses import replace

from coordinator.domain.placement import (
    AtomSlot,
    DeviceRequest,
    NodeSlot,
    PlacementRequest,
    PoolSnapshot,
    Shortfall,
)
from coordinator.domain.placer import place
from tests.unit.test_placer import READY, book, gpus, node

DOWN = replace(READY, reachable=False)


def test_an_empty_pool_and_a_pool_with_nothing_allocatable_say_so() -> None:
    empty = place(gpus(2), PoolSnapshot(()))
    assert empty.fits is False and empty.reason == "the pool has no nodes"
    assert empty.shortfalls == (Shortfall(0, "gpu", 2, 0, "the pool has no nodes"),)
    down = place(gpus(2), PoolSnapshot((node("a", state=DOWN), node("b", state=DOWN))))
    reason = "no allocatable node in the pool"
    assert down.reason == reason
    assert down.shortfalls == (Shortfall(0, "gpu", 2, 0, reason),)
    assert down.filtered == {"not allocatable: unreachable": 2}


def test_a_request_too_big_for_any_node_names_the_most_one_node_has() -> None:
    snap = PoolSnapshot((node("a", gpus=2), node("b", gpus=3), node("c", state=DOWN)))
    failed = place(gpus(4), snap)
    assert failed.reason == (
        "no node can take the whole request: too few free matching gpu on 2 nodes, "
        "not allocatable: unreachable on 1 node"
    )
    assert failed.shortfalls == (
        Shortfall(0, "gpu", 4, 3, "at most 3 free gpu matching on one node"),
    )
    mig = place(PlacementRequest(devices=(DeviceRequest("gpu.mig", 1),)), snap)
    assert mig.shortfalls == (
        Shortfall(0, "gpu.mig", 1, 0, "at most 0 free gpu.mig matching on one node"),
    )


def test_the_summary_names_the_three_commonest_reasons() -> None:
    nodes = (
        node("a", gpus=1),
        node("b", gpus=1),
        node("c", gpus=1),
        node("d", state=DOWN),
        node("e", state=DOWN),
        node("f", state=replace(READY, maintenance=True)),
        replace(node("g"), profile_id="other"),
    )
    failed = place(replace(gpus(2), profile_id="std"), PoolSnapshot(nodes))
    assert failed.reason == (
        "no node can take the whole request: too few free matching gpu on 3 nodes, "
        "not allocatable: unreachable on 2 nodes, not allocatable: maintenance on 1 node"
    )


def test_an_nvlink_request_names_the_largest_linked_set() -> None:
    snap = PoolSnapshot((node("a", gpus=4, cliques=2),))
    failed = place(gpus(3, topology="nvlink-all"), snap)
    assert failed.shortfalls == (
        Shortfall(0, "gpu", 3, 2, "at most 2 free NVLink-connected gpu matching on one node"),
    )


def test_entries_that_fit_alone_but_not_in_one_clique_say_so() -> None:
    a = node("a", gpus=4, cliques=2)
    models = tuple(
        replace(x, attrs={**x.attrs, "model": "A" if i < 3 else "B"}) for i, x in enumerate(a.atoms)
    )
    snap = PoolSnapshot((replace(a, atoms=models),))
    req = PlacementRequest(
        devices=(
            DeviceRequest("gpu", 1, (("model", ("A",)),)),
            DeviceRequest("gpu", 2, (("model", ("B",)),)),
        ),
        topology="nvlink-all",
    )
    failed = place(req, snap)
    # Each entry fits in a clique of its own; no clique holds all three.
    why = "at most 2 NVLink-connected free gpu on one node, 3 asked for the whole request"
    assert failed.shortfalls == (
        Shortfall(0, "gpu", 1, 2, why),
        Shortfall(1, "gpu", 2, 2, why),
    )


def test_a_gpu_and_a_vf_on_different_nodes_do_not_fit_together() -> None:
    vf = AtomSlot("v:nic.vf:1", "nic.vf", True, {"sriov": True}, "0000:40:00.0")
    with_vf = NodeSlot("v", READY, {}, "std", 1, (vf,), {"vcpu": 8, "memoryGiB": 64})
    snap = PoolSnapshot((node("g", gpus=1), with_vf))
    req = PlacementRequest(devices=(DeviceRequest("gpu", 1), DeviceRequest("nic.vf", 1)))
    failed = place(req, snap)
    assert [s.reason for s in failed.shortfalls] == [
        "fits alone, not together with the other devices on one node",
    ] * 2


def test_a_busy_whole_node_and_short_scalars_say_which() -> None:
    snap = book(PoolSnapshot((node("a", gpus=2),)), ["a:gpu:0"], "x")
    whole = place(gpus(1, binding="node"), snap)
    assert whole.reason == ("no whole node is free: node is partly booked in the window on 1 node")
    assert whole.shortfalls == (Shortfall(0, "gpu", 1, 1, "node is partly booked in the window"),)
    req = replace(gpus(1), resources=(("vcpu", 200),))
    short = place(req, PoolSnapshot((node("a", gpus=2), node("b", gpus=2))))
    assert short.shortfalls == (
        Shortfall(0, "gpu", 1, 2, "at most 128 vcpu free on one node in the window, 200 asked"),
    )


def _matrix_node(links: dict[int, set[int]], models: str = "AAAA") -> NodeSlot:
    atoms = tuple(
        AtomSlot(
            f"m:gpu:{i}",
            "gpu",
            True,
            {"model": models[i]},
            f"G{i}",
            frozenset(f"G{j}" for j in links.get(i, set())),
        )
        for i in range(len(models))
    )
    return NodeSlot("m", READY, {}, "std", 1, atoms, {"vcpu": 8, "memoryGiB": 64})


def test_nvlink_cliques_come_from_the_matrix_pairwise_links() -> None:
    # A chain 0-1-2-3: one connected component, but no three GPUs pairwise linked.
    chain = _matrix_node({0: {1}, 1: {0, 2}, 2: {1, 3}, 3: {2}})
    pair = place(gpus(2, topology="nvlink-all"), PoolSnapshot((chain,)))
    assert pair.fits
    taken = sorted(a.device_id for a in pair.candidates[0].atoms)
    assert taken in (["G0", "G1"], ["G1", "G2"], ["G2", "G3"])
    assert not place(gpus(3, topology="nvlink-all"), PoolSnapshot((chain,))).fits
    # A link one side does not list is no link.
    one_sided = _matrix_node({0: {1}, 1: set(), 2: {3}, 3: {2}})
    got = place(gpus(2, topology="nvlink-all"), PoolSnapshot((one_sided,)))
    assert sorted(a.device_id for a in got.candidates[0].atoms) == ["G2", "G3"]
    triangle = _matrix_node({0: {1, 2}, 1: {0, 2}, 2: {0, 1}, 3: set()})
    three = place(gpus(3, topology="nvlink-all"), PoolSnapshot((triangle,)))
    assert sorted(a.device_id for a in three.candidates[0].atoms) == ["G0", "G1", "G2"]


def test_selectors_inside_one_clique_are_matched_together() -> None:
    full = {i: {j for j in range(4) if j != i} for i in range(4)}
    snap = PoolSnapshot((_matrix_node(full, models="AABB"),))
    req = PlacementRequest(
        devices=(
            DeviceRequest("gpu", 1, (("model", ("B",)),)),
            DeviceRequest("gpu", 2, (("model", ("A",)),)),
        ),
        topology="nvlink-all",
    )
    result = place(req, snap)
    assert result.fits
    assert sorted(a.device_id for a in result.candidates[0].atoms) == ["G0", "G1", "G2"]
    over = replace(req, devices=(DeviceRequest("gpu", 3, (("model", ("B",)),)),))
    assert not place(over, snap).fits
