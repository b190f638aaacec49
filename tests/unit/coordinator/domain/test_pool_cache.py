"""The snapshot cache's pool in memory (`pool_cache`): a batch's fork shares the cache's
lists until either side adds a booking (copy on write), so neither ever sees the
other's additions; and a node's resolved claims and a window's irregular nodes, kept
up to date as bookings are added, are exactly what computing them afresh gives."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.domain.placement_model import DeviceRequest, PlacementRequest
from coordinator.domain.placer import place
from coordinator.domain.pool_cache import HeldAtom, PoolCache, build_snapshot
from tests.unit.coordinator.domain.test_booking_decision import HOUR, NOW, node, pool


def held(node_id: str, gpu: int, rid: str, start: int = NOW, hours: int = 1) -> HeldAtom:
    return HeldAtom(f"{node_id}:gpu:{gpu}", node_id, "gpu", rid, False, start, start + hours * HOUR)


def fresh(cache: PoolCache) -> PoolCache:
    """The same nodes and bookings, indexed from scratch (a reload)."""
    twin = pool(*cache.nodes).cache
    twin.atoms, twin.scalars = list(cache.atoms), list(cache.scalars)
    twin.index(twin.atoms)
    return twin


def free_gpus(cache: PoolCache, start: int = NOW, end: int = NOW + HOUR) -> dict[str, int]:
    """Every node a one-GPU request fits on in the window (the ranked candidates)."""
    req = PlacementRequest(devices=(DeviceRequest("gpu", 1),))
    placement = place(req, build_snapshot(cache, start, end, frozenset()), limit=100)
    return {pick.node_id: len(pick.atoms) for pick in placement.candidates}


def test_a_fork_and_its_cache_never_see_each_others_additions() -> None:
    cache = pool(node("n0", gpus=2), node("n1", gpus=2)).cache
    cache.add([held("n0", 0, "r0")], [])
    cache.claims("n0")  # resolved before the fork: both sides extend their own
    cache.free_counts()
    fork = cache.fork()
    fork.add([held("n0", 1, "r1"), held("n1", 0, "r1")], [])
    assert [h.reservation_id for h in cache.by_node["n0"]] == ["r0"]
    assert "n1" not in cache.by_node and len(cache.atoms) == 1
    assert len(cache.claims("n0").claims) == 1
    assert free_gpus(cache) == {"n1": 1, "n0": 1}
    assert free_gpus(fork) == {"n1": 1}
    # The cache adds after the fork (a booking committed alone): the fork is unmoved.
    cache.add([held("n1", 1, "r2")], [])
    assert [h.reservation_id for h in fork.by_node["n1"]] == ["r1"]
    assert len(fork.atoms) == 3 and len(fork.spans) == 3
    assert free_gpus(fork) == {"n1": 1}
    assert free_gpus(cache) == {"n0": 1, "n1": 1}


def test_a_fork_of_a_fork_copies_what_it_adds_to() -> None:
    cache = pool(node("n0", gpus=4)).cache
    first = cache.fork()
    first.add([held("n0", 0, "r0")], [])
    second = first.fork()
    second.add([held("n0", 1, "r1")], [])
    first.add([held("n0", 2, "r2")], [])
    assert [h.reservation_id for h in second.by_node["n0"]] == ["r0", "r1"]
    assert [h.reservation_id for h in first.by_node["n0"]] == ["r0", "r2"]
    assert cache.by_node == {} and cache.atoms == []


bookings = st.lists(
    st.tuples(
        st.sampled_from(["n0", "n1"]),
        st.integers(0, 3),  # gpu
        st.integers(0, 4),  # start, hours from now
        st.integers(1, 3),  # hours
        st.booleans(),  # claims resolved (asked for) before this one is added
        st.booleans(),  # forked before it is added
    ),
    max_size=12,
)


@settings(max_examples=80, deadline=None)
@given(bookings)
def test_what_is_kept_up_to_date_as_bookings_are_added_is_what_a_reload_gives(
    added: list[tuple[str, int, int, int, bool, bool]],
) -> None:
    cache = pool(node("n0"), node("n1")).cache
    for k, (node_id, gpu, at, hours, ask, fork) in enumerate(added):
        if ask:
            cache.claims(node_id)
            cache.free_counts()
            for w in range(4):
                cache.irregular(NOW + w * HOUR, NOW + (w + 1) * HOUR)
        if fork:
            cache = cache.fork()
        cache.add([held(node_id, gpu, f"r{k}", NOW + at * HOUR, hours)], [])
    again = fresh(cache)
    for node_id in ("n0", "n1"):
        assert cache.claims(node_id) == again.claims(node_id)
    for at in range(5):
        start = NOW + at * HOUR
        assert cache.irregular(start, start + HOUR) == again.irregular(start, start + HOUR)
        assert free_gpus(cache, start, start + HOUR) == free_gpus(again, start, start + HOUR)


@settings(max_examples=120, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 40), st.integers(1, 6)), max_size=16),
    st.integers(0, 45),
    st.integers(1, 8),
    st.sets(st.integers(0, 15), max_size=3),
)
def test_a_window_of_a_nodes_claims_is_every_booking_overlapping_it(
    added: list[tuple[int, int, int]], at: int, hours: int, ignored: set[int]
) -> None:
    """Claims kept sorted by start (a window reads only those starting before its end)
    still give every overlapping booking not ignored, each once, for any window."""
    cache = pool(node("n0")).cache
    for k, (gpu, start, length) in enumerate(added):
        if k % 3 == 0:
            cache.claims("n0")  # resolved, then extended by the bookings after it
        cache.add([held("n0", gpu, f"r{k}", NOW + start * HOUR, length)], [])
    start, end = NOW + at * HOUR, NOW + (at + hours) * HOUR
    ignore = frozenset(f"r{k}" for k in ignored)
    found = cache.claims("n0").window(start, end, ignore)
    expected = [
        (h.atom_id, h.reservation_id)
        for h in cache.by_node.get("n0", ())
        if h.start < end and h.end > start and h.reservation_id not in ignore
    ]
    assert sorted((c.atom_id, c.holder.reservation_id) for c in found) == sorted(expected)
