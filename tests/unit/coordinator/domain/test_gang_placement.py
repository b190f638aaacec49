"""Gangs (SPEC §5): every member on its own node, all in one domain of the topology key
(or anywhere in the pool without one), whole-node gangs within the pool's uncommitted
memory; and what a refusal says — the placer's exact answers, so that a changed rule or
message shows."""

from __future__ import annotations

from dataclasses import replace

from coordinator.domain.placement_model import PoolSnapshot, Shortfall
from coordinator.domain.placer import GANG_MEMORY, place
from tests.unit.coordinator.domain.test_placer import READY, book, gpus, node


def test_a_gang_takes_the_best_packed_rack_and_skips_nodes_without_the_label() -> None:
    unlabelled = [replace(node(f"u{i}"), labels={}) for i in range(2)]
    nodes = (
        node("a0", gpus=4, rack="r1"),
        node("a1", gpus=4, rack="r1"),
        node("b0", gpus=8, rack="r2"),
        node("b1", gpus=8, rack="r2"),
        *unlabelled,
    )
    snap = book(PoolSnapshot(nodes), ["a0:gpu:0", "b0:gpu:0"], "x", spot=True)
    result = place(gpus(1, gang_size=2, gang_key="rack"), snap)
    assert result.fits and result.gang
    # r1's members are left with fewer free GPUs: they score higher, so r1 wins.
    assert [c.node_id for c in result.candidates] == ["a0", "a1"]
    assert result.chosen == result.candidates
    assert [c.score for c in result.candidates] == [round(1 / 3, 6), 0.25]
    assert result.victims == frozenset()
    assert result.filtered == {"no rack label": 2}


def test_a_gang_preempting_spot_holders_names_every_members_victims() -> None:
    nodes = (node("a", gpus=1, rack="r1"), node("b", gpus=1, rack="r1"))
    snap = book(PoolSnapshot(nodes), ["a:gpu:0"], "spot-a", spot=True)
    snap = book(snap, ["b:gpu:0"], "spot-b", spot=True)
    assert not place(gpus(1, gang_size=2, gang_key="rack"), snap).fits
    again = place(gpus(1, gang_size=2, gang_key="rack"), snap, ignore_spot=True)
    assert again.fits and again.victims == frozenset({"spot-a", "spot-b"})


def test_a_gang_without_a_key_spans_the_pool_and_says_how_many_nodes_fit() -> None:
    nodes = (node("a", rack="r1"), node("b", rack="r2"), node("c", rack="r3"))
    fits = place(gpus(8, gang_size=3), PoolSnapshot(nodes))
    assert fits.fits and [c.node_id for c in fits.candidates] == ["a", "b", "c"]
    failed = place(gpus(8, gang_size=4), PoolSnapshot(nodes))
    reason = "needs 4 nodes in the pool, the pool has 3"
    assert failed.fits is False and failed.gang
    assert failed.reason == reason
    assert failed.shortfalls == (Shortfall(None, None, 4, 3, reason),)
    assert failed.candidates == ()


def test_a_gang_names_the_rack_with_most_fitting_nodes_and_its_count() -> None:
    nodes = (
        node("a0", rack="r1"),
        node("b0", rack="r2"),
        node("b1", rack="r2"),
        node("c0", rack="r3"),
    )
    failed = place(gpus(8, gang_size=3, gang_key="rack"), PoolSnapshot(nodes))
    reason = "needs 3 nodes in one rack, best rack r2 has 2"
    assert failed.reason == reason
    assert failed.shortfalls == (Shortfall(None, None, 3, 2, reason),)
    # Ties go to the first rack by name.
    tied = place(gpus(8, gang_size=3, gang_key="rack"), PoolSnapshot(nodes[:1] + nodes[3:]))
    assert tied.reason == "needs 3 nodes in one rack, best rack r1 has 1"


def test_a_gang_that_fits_nowhere_says_so_with_the_nodes_turned_away() -> None:
    snap = PoolSnapshot((node("a", gpus=2, rack="r1"), node("b", gpus=2, rack="r1")))
    failed = place(gpus(4, gang_size=2, gang_key="rack"), snap)
    reason = "needs 2 nodes in one rack, no rack has any"
    assert failed.reason == reason
    assert failed.shortfalls == (Shortfall(None, None, 2, 0, reason),)
    assert failed.filtered == {"too few free matching gpu": 2}
    anywhere = place(gpus(4, gang_size=2), snap)
    assert anywhere.reason == "needs 2 nodes in the pool, no node fits one member"


def test_a_whole_node_gang_takes_its_smallest_members_within_the_pools_memory() -> None:
    nodes = (
        node("big", memory=1024, rack="r1"),
        node("mid", memory=512, rack="r1"),
        node("small", memory=256, rack="r1"),
    )
    gang = gpus(1, binding="node", gang_size=2, gang_key="rack")
    roomy = place(gang, replace(PoolSnapshot(nodes), pool_free={"memoryGiB": 4096}))
    assert [c.node_id for c in roomy.candidates] == ["big", "mid"]  # by score, then id
    tight = place(gang, replace(PoolSnapshot(nodes), pool_free={"memoryGiB": 768}))
    assert tight.fits and sorted(c.node_id for c in tight.candidates) == ["mid", "small"]
    exact = place(gang, replace(PoolSnapshot(nodes), pool_free={"memoryGiB": 1536}))
    assert sorted(c.node_id for c in exact.candidates) == ["big", "mid"]


def test_a_whole_node_gang_over_the_pools_memory_says_how_much_is_left() -> None:
    nodes = (node("a", memory=512, rack="r1"), node("b", memory=512, rack="r1"))
    gang = gpus(1, binding="node", gang_size=2, gang_key="rack")
    failed = place(gang, replace(PoolSnapshot(nodes), pool_free={"memoryGiB": 1023}))
    reason = "needs 2 whole nodes whose memoryGiB fits in the pool's 1023 uncommitted in the window"
    assert failed.fits is False and failed.gang
    assert failed.reason == reason
    assert failed.shortfalls == (Shortfall(None, "memoryGiB", 2, 0, reason),)
    assert failed.filtered == {GANG_MEMORY: 2}
    # Without a pool memory figure, whole nodes are not bounded by it.
    assert place(gang, PoolSnapshot(nodes)).fits


def test_a_gang_of_regular_members_is_not_bounded_by_node_memory() -> None:
    nodes = (node("a", memory=512, rack="r1"), node("b", memory=512, rack="r1"))
    snap = replace(PoolSnapshot(nodes), pool_free={"memoryGiB": 10})
    assert place(gpus(1, gang_size=2, gang_key="rack"), snap).fits


def test_over_memory_the_smallest_members_go_first_and_the_best_packed_among_equals() -> None:
    nodes = (
        node("a", gpus=1, memory=512, rack="r1"),
        node("b", gpus=2, memory=512, rack="r1"),
        node("c", gpus=8, memory=256, rack="r1"),
    )
    gang = gpus(1, binding="node", gang_size=2, gang_key="rack")
    # a and b rank first (fewest atoms) but need 1024; c and the better packed of a and b
    # need exactly the 768 left.
    snap = replace(PoolSnapshot(nodes), pool_free={"memoryGiB": 768})
    result = place(gang, snap)
    assert result.fits and sorted(c.node_id for c in result.candidates) == ["a", "c"]


def test_a_rack_over_memory_does_not_end_the_search_and_every_one_is_counted() -> None:
    nodes = (
        node("a0", memory=512, rack="r1"),
        node("a1", memory=512, rack="r1"),
        node("b0", memory=512, rack="r2"),
        node("b1", memory=512, rack="r2"),
        node("c0", memory=256, rack="r3"),
        node("c1", memory=256, rack="r3"),
    )
    gang = gpus(1, binding="node", gang_size=2, gang_key="rack")
    fits = place(gang, replace(PoolSnapshot(nodes), pool_free={"memoryGiB": 600}))
    assert [c.node_id for c in fits.candidates] == ["c0", "c1"]
    over = place(gang, replace(PoolSnapshot(nodes[:4]), pool_free={"memoryGiB": 600}))
    assert over.filtered == {GANG_MEMORY: 4}


def test_equally_good_racks_go_to_the_first_by_name() -> None:
    nodes = (
        node("b0", rack="r2"),
        node("b1", rack="r2"),
        node("a0", rack="r1"),
        node("a1", rack="r1"),
    )
    result = place(gpus(1, gang_size=2, gang_key="rack"), PoolSnapshot(nodes))
    assert [c.node_id for c in result.candidates] == ["a0", "a1"]


def test_a_whole_node_gang_short_of_nodes_says_so_not_memory() -> None:
    nodes = (node("a", memory=512, rack="r1"), node("b", memory=512, rack="r2"))
    gang = gpus(1, binding="node", gang_size=2, gang_key="rack")
    failed = place(gang, replace(PoolSnapshot(nodes), pool_free={"memoryGiB": 4096}))
    assert failed.fits is False
    assert failed.reason == "needs 2 nodes in one rack, best rack r1 has 1"


def test_a_gang_counts_the_nodes_it_may_not_use() -> None:
    """A node in maintenance is no member: the gang goes on the two others, and when it
    is one node short the answer counts the node turned away under its reason."""
    held = node("m", state=replace(READY, maintenance=True))
    snap = PoolSnapshot((node("a", gpus=2), held, node("b", gpus=2)))
    fits = place(gpus(2, gang_size=2), snap)
    assert sorted(c.node_id for c in fits.chosen) == ["a", "b"]
    failed = place(gpus(2, gang_size=3), snap)
    assert not failed.fits and failed.filtered == {"not allocatable: maintenance": 1}
