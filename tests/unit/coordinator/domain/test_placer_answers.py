"""What the placer tells a tenant it refuses (SPEC §5 "why not"), word for word, and
NVLink cliques from a link matrix: pairwise links, not connected components."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from coordinator.domain import placer
from coordinator.domain.free_index import FreeCounts
from coordinator.domain.node_fit import BusyUnits
from coordinator.domain.placement_model import (
    AtomSlot,
    DeviceRequest,
    Holder,
    NodeSlot,
    PlacementRequest,
    PoolSnapshot,
    Shortfall,
)
from coordinator.domain.placer import place
from tests.unit.coordinator.domain.test_placer import READY, book, gpus, node

VCPU_TAKEN = {"vcpu": ((128, Holder("r", False)),)}

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


def test_an_nvlink_gpu_no_node_has_says_none_is_linked_and_free() -> None:
    req = PlacementRequest(
        devices=(DeviceRequest("gpu", 1, (("model", ("B200",)),)),), topology="nvlink-all"
    )
    failed = place(req, PoolSnapshot((node("a", gpus=2),)))
    assert failed.reason == (
        "no node can take the whole request: too few NVLink-connected free gpu on 1 node"
    )
    assert failed.shortfalls == (
        Shortfall(0, "gpu", 1, 0, "at most 0 free NVLink-connected gpu matching on one node"),
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


def test_a_request_over_the_pools_uncommitted_memory_is_refused_up_front() -> None:
    snap = replace(PoolSnapshot((node("a"),)), pool_free={"memoryGiB": 64})
    one = place(replace(gpus(1), resources=(("memoryGiB", 100),)), snap)
    reason = "64 memoryGiB of the pool is uncommitted in the window, 100 asked"
    assert (one.fits, one.reason, one.gang) == (False, reason, False)
    assert one.shortfalls == (Shortfall(None, "memoryGiB", 100, 64, reason),)
    gang = place(replace(gpus(1, gang_size=2), resources=(("memoryGiB", 40),)), snap)
    reason = "64 memoryGiB of the pool is uncommitted in the window, 80 asked"
    assert (gang.fits, gang.reason, gang.gang) == (False, reason, True)
    assert gang.shortfalls == (Shortfall(None, "memoryGiB", 80, 64, reason),)
    assert place(replace(gpus(1), resources=(("memoryGiB", 64),)), snap).fits


def test_kept_counts_still_turn_away_nodes_that_may_not_take_the_request() -> None:
    nodes = (node("a", state=DOWN), node("b"))
    order = FreeCounts(nodes, lambda n: ()).window(frozenset(), 0, 10)
    result = place(gpus(1), replace(PoolSnapshot(nodes), order=order))
    assert [c.node_id for c in result.candidates] == ["b"]
    assert result.filtered == {"not allocatable: unreachable": 1}


def test_whole_nodes_score_by_size_take_exactly_the_pools_memory_and_name_spot_victims() -> None:
    snap = replace(
        PoolSnapshot((node("a", gpus=1, memory=512), node("b", gpus=3, memory=512))),
        pool_free={"memoryGiB": 512},
    )
    result = place(gpus(1, binding="node"), snap)
    assert [(c.node_id, c.score) for c in result.candidates] == [("a", 0.333333), ("b", 0.2)]
    spot = book(snap, ["a:gpu:0"], "spot-1", spot=True)
    assert [c.node_id for c in place(gpus(1, binding="node"), spot).candidates] == ["b"]
    preempting = place(gpus(1, binding="node"), spot, ignore_spot=True)
    assert preempting.candidates[0].victims == frozenset({"spot-1"})


def test_a_pick_carries_the_scalars_asked_and_only_those() -> None:
    req = replace(gpus(1), resources=(("vcpu", 1), ("memoryGiB", 0)))
    pick = place(req, PoolSnapshot((node("a"),))).candidates[0]
    assert pick.resources == (("vcpu", 1),)


def test_equally_common_reasons_are_summarised_by_name() -> None:
    # Seen unreachable first, named maintenance first.
    nodes = (node("a", state=DOWN), node("b", state=replace(READY, maintenance=True)))
    failed = place(gpus(1), PoolSnapshot(nodes))
    assert failed.filtered == {"not allocatable: maintenance": 1, "not allocatable: unreachable": 1}
    mixed = (node("c", gpus=1), *nodes)
    assert place(gpus(2), PoolSnapshot(mixed)).reason == (
        "no node can take the whole request: not allocatable: maintenance on 1 node, "
        "not allocatable: unreachable on 1 node, too few free matching gpu on 1 node"
    )


def test_a_scalar_shortfall_names_the_most_free_on_any_one_node_zero_included() -> None:
    nodes = (node("big", memory=512), node("small", memory=64))
    failed = place(replace(gpus(1), resources=(("memoryGiB", 1024),)), PoolSnapshot(nodes))
    assert failed.shortfalls[0].reason == (
        "at most 512 memoryGiB free on one node in the window, 1024 asked"
    )
    full = PoolSnapshot((node("a"),), scalar_holders={"a": VCPU_TAKEN})
    none_free = place(replace(gpus(1), resources=(("vcpu", 1),)), full)
    assert (
        none_free.shortfalls[0].reason == "at most 0 vcpu free on one node in the window, 1 asked"
    )


def test_the_commonest_node_level_reason_explains_a_whole_node_refusal() -> None:
    snap = replace(
        book(PoolSnapshot((node("a", memory=256), node("b"), node("c"))), ["a:gpu:0"], "x"),
        pool_free={"memoryGiB": 512},
    )
    failed = place(gpus(1, binding="node"), snap)
    why = "the pool's uncommitted memory is less than the node's"
    assert failed.reason == (
        f"no whole node is free: {why} on 2 nodes, node is partly booked in the window on 1 node"
    )
    assert failed.shortfalls == (Shortfall(0, "gpu", 1, 8, why),)


def test_one_nvlink_entry_short_of_a_scalar_says_the_scalar() -> None:
    snap = PoolSnapshot((node("a"),))
    failed = place(replace(gpus(2, topology="nvlink-all"), resources=(("vcpu", 200),)), snap)
    assert failed.shortfalls == (
        Shortfall(0, "gpu", 2, 8, "at most 128 vcpu free on one node in the window, 200 asked"),
    )
    # Two entries whose clique of exactly two is there: the scalar is still what is short.
    pair = PlacementRequest(
        devices=(DeviceRequest("gpu", 1), DeviceRequest("gpu", 1)),
        topology="nvlink-all",
        resources=(("vcpu", 200),),
    )
    short = place(pair, PoolSnapshot((node("b", gpus=2),)))
    why = "at most 128 vcpu free on one node in the window, 200 asked"
    assert short.shortfalls == (Shortfall(0, "gpu", 1, 2, why), Shortfall(1, "gpu", 1, 2, why))


def test_a_fit_counts_the_nodes_tried_and_turned_away_and_stops_at_the_limit() -> None:
    a100 = (node("a", model="A100"), node("b", model="A100"))
    snap = PoolSnapshot((*a100, node("h", model="H100")))
    req = PlacementRequest(devices=(DeviceRequest("gpu", 1, (("model", ("H100",)),)),))
    result = place(req, snap)
    assert [c.node_id for c in result.candidates] == ["h"]
    assert result.filtered == {"too few free matching gpu": 2}
    many = PoolSnapshot(tuple(node(f"n{i:02}") for i in range(12)))
    assert [c.node_id for c in place(gpus(1), many).candidates] == [f"n{i:02}" for i in range(10)]
    assert [c.node_id for c in place(gpus(1), many, limit=2).candidates] == ["n00", "n01"]


def test_a_refusal_judges_each_node_once_and_answers_as_every_node_judged_would(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One pass (as Nomad's feasibility checkers): a node turned away is recorded with
    its reason as it is tried; nodes counted out for too few free atoms are judged only
    when nothing fits, most free first, and only while one of them could have more free
    than a node already judged; no node is judged twice."""
    # Six nodes with four GPUs in two NVLink pairs (tried, and turned away: at most a
    # pair free), three with two (counted out without being tried: n7 has two free, n6
    # and n8 one, which cannot beat the pairs already seen).
    nodes = tuple(node(f"n{i}", gpus=4 if i < 6 else 2, cliques=2) for i in range(9))
    snap = book(PoolSnapshot(nodes), [f"n{i}:gpu:0" for i in range(0, 9, 2)], "r")
    views: Counter[str] = Counter()

    class Counted(placer.NodeView):
        def __init__(
            self, n: NodeSlot, s: PoolSnapshot, ignore_spot: bool, busy: BusyUnits = frozenset()
        ) -> None:
            views[n.node_id] += 1
            super().__init__(n, s, ignore_spot, busy)

    monkeypatch.setattr(placer, "NodeView", Counted)
    req = PlacementRequest(devices=(DeviceRequest("gpu", 3, topology="nvlink-all"),))
    refused = place(req, snap)
    assert not refused.fits
    assert set(views) == {f"n{i}" for i in (0, 1, 2, 3, 4, 5, 7)} and max(views.values()) == 1
    assert refused.reason is not None and refused.reason.startswith("no node can take")
    assert refused.filtered == {"too few NVLink-connected free gpu": 9}
    kept = replace(snap, order=FreeCounts(nodes, lambda n: snap.held.get(n, ())).window(
        frozenset(), 0, 1))  # fmt: skip
    assert place(req, kept) == refused


def test_a_node_showing_devices_another_node_holds_is_never_offered() -> None:
    """Issue 31: the same host under a second node id (both in service) is turned away
    whole, counted and named, on the full pass and the free-count index alike."""
    dup = replace(node("b", gpus=8), duplicate_of=("a",))
    snap = PoolSnapshot((node("a", gpus=2), dup))
    fits = place(gpus(1), snap)
    assert [c.node_id for c in fits.candidates] == ["a"]
    assert fits.filtered == {placer.DUPLICATE_DEVICES: 1}
    failed = place(gpus(4), snap)
    assert failed.reason == (
        "no node can take the whole request: not allocatable: shows devices another "
        "node holds on 1 node, too few free matching gpu on 1 node"
    )
    whole = place(PlacementRequest(devices=(DeviceRequest("node", 1),)), snap)
    assert [c.node_id for c in whole.candidates] == ["a"]
    order = FreeCounts(snap.nodes, lambda n: ()).window(frozenset(), 0, 10)
    indexed = place(gpus(1), replace(snap, order=order))
    assert [c.node_id for c in indexed.candidates] == ["a"]
    assert indexed.filtered == {placer.DUPLICATE_DEVICES: 1}


def test_a_node_without_a_scalar_takes_no_request_for_one() -> None:
    """The fixture's nodes have no 1 GiB hugepages, and nothing holds any: a request for
    one fits nowhere, and says the most any node has free is 0."""
    snap = PoolSnapshot((node("a"),))
    failed = place(replace(gpus(1), resources=(("hugepages1Gi", 1),)), snap)
    assert not failed.fits
    assert failed.shortfalls[0].reason == (
        "at most 0 hugepages1Gi free on one node in the window, 1 asked"
    )
