"""Kept free counts (`free_index`) against a recount: after random sequences of
bookings and releases on random small pools (current forms, retired forms, whole nodes,
spot or not; bookings in and out of the window), every kept count equals what
`free_among` counts afresh (a touch that only adds bookings says over which spans, and
keeps the counts of the windows they miss), and the placer answers exactly what it
answers when it counts every node itself."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.domain.free_index import FreeCounts, Key
from coordinator.domain.node_fit import free_among
from coordinator.domain.placement_model import (
    HeldClaim,
    Holder,
    NodeSlot,
    PlacementRequest,
    PoolSnapshot,
)
from coordinator.domain.placer import place
from tests.unit.coordinator.domain.test_placer import READY
from tests.unit.coordinator.domain.test_placer import node as gpu_node
from tests.unit.coordinator.domain.test_placer_properties import holds, nodes, requests

# A booking: (nodeId, start, end, claim); windows are drawn from the same few instants.
Booking = tuple[str, int, int, HeldClaim]
TIMES = (0, 10, 20, 30, 40)


def _claims(bookings: list[Booking], node_id: str, start: int, end: int) -> tuple[HeldClaim, ...]:
    return tuple(h for n, s, e, h in bookings if n == node_id and s < end and e > start)


def _refusal(node: NodeSlot) -> str | None:
    return None if node.state.reachable else "not allocatable: unreachable"


@st.composite
def histories(draw: st.DrawFn) -> tuple[tuple[NodeSlot, ...], list[list[Booking]]]:
    """Nodes, and the bookings after each step of a random sequence of bookings (a few
    claims on one node, for one span) and releases (one earlier booking gone)."""
    pool = tuple(draw(nodes(f"n{i}"))[0] for i in range(draw(st.integers(1, 4))))
    current: list[Booking] = []
    steps = []
    for _ in range(draw(st.integers(1, 8))):
        if current and draw(st.integers(0, 2)) == 0:
            current = [b for b in current if b != draw(st.sampled_from(current))]
        else:
            node = draw(st.sampled_from(pool))
            start = draw(st.sampled_from(TIMES[:-1]))
            end = draw(st.sampled_from([t for t in TIMES if t > start]))
            current = current + [(node.node_id, start, end, h) for h in draw(holds(node))]
        steps.append(current)
    return pool, steps


@settings(max_examples=300, deadline=None)
@given(
    history=histories(),
    reqs=st.lists(requests, min_size=1, max_size=3),
    ignore_spot=st.booleans(),
    window=st.tuples(st.sampled_from(TIMES[:-1]), st.integers(1, 40)),
)
def test_kept_counts_equal_a_recount_and_the_placer_does_not_tell_them_apart(
    history: tuple[tuple[NodeSlot, ...], list[list[Booking]]],
    reqs: list[PlacementRequest],
    ignore_spot: bool,
    window: tuple[int, int],
) -> None:
    pool, steps = history
    bookings: list[Booking] = []
    counts = FreeCounts(pool, lambda n: _claims(bookings, n, -1, 10**9))
    keys: list[Key] = []
    for step in steps:
        changed = {b[0] for b in set(bookings) ^ set(step)}
        grown = set(bookings) <= set(step)
        added: dict[str, list[tuple[int, int]]] = {}
        for n, start, end, _ in set(step) - set(bookings):
            added.setdefault(n, []).append((start, end))
        bookings = step
        # Bookings only added (a booking, a batch): the spans say which windows moved.
        counts.touch(changed, added if grown else None)
        for req in reqs:
            classes = frozenset(d.cls for d in req.devices)
            key = (classes, ignore_spot, None, None)
            keys.append(key)
            index = counts.index(key, _refusal)
            for node in pool:
                if _refusal(node) is not None:
                    assert node.node_id not in index.free
                    continue
                everything = _claims(bookings, node.node_id, -1, 10**9)
                recount = free_among(node, everything, set(classes), ignore_spot)
                assert index.free[node.node_id] == recount
            assert index.order == sorted((f, n) for n, f in index.free.items())

            start, end = window[0], window[0] + window[1]
            held = {n.node_id: _claims(bookings, n.node_id, start, end) for n in pool}
            irregular = frozenset(n for n, s, e, _ in bookings if not (s < end and e > start))
            snap = PoolSnapshot(pool, held=held)
            kept = replace(snap, order=counts.window(irregular, start, end))
            assert place(req, kept, ignore_spot=ignore_spot) == place(
                req, snap, ignore_spot=ignore_spot
            )


@settings(max_examples=400, deadline=None)
@given(
    history=histories(),
    req=requests,
    need=st.integers(0, 6),
    ignore_spot=st.booleans(),
    window=st.tuples(st.sampled_from(TIMES[:-1]), st.integers(1, 40)),
)
def test_candidates_are_every_fitting_node_fewest_free_first_however_many_are_irregular(
    history: tuple[tuple[NodeSlot, ...], list[list[Booking]]],
    req: PlacementRequest,
    need: int,
    ignore_spot: bool,
    window: tuple[int, int],
) -> None:
    """The window's candidates (irregular nodes counted lazily) are exactly the eligible
    nodes with at least `need` free in the window, ascending by (free, nodeId), and
    `few` counts the rest: what counting every node afresh gives."""
    pool, steps = history
    bookings = steps[-1]
    counts = FreeCounts(pool, lambda n: _claims(bookings, n, -1, 10**9))
    start, end = window[0], window[0] + window[1]
    held = {n.node_id: _claims(bookings, n.node_id, start, end) for n in pool}
    irregular = frozenset(n for n, s, e, _ in bookings if not (s < end and e > start))
    classes = frozenset(d.cls for d in req.devices)
    key: Key = (classes, ignore_spot, None, None)
    order = counts.window(irregular, start, end)
    refused, few, candidates = order.candidates(key, _refusal, held, need)
    recount = sorted(
        (free_among(n, held[n.node_id], set(classes), ignore_spot), n.node_id)
        for n in pool
        if _refusal(n) is None
    )
    assert [(f, n) for f, n, _ in candidates] == [c for c in recount if c[0] >= need]
    assert few == sum(1 for c in recount if c[0] < need)
    assert sum(refused.values()) == sum(1 for n in pool if _refusal(n) is not None)


class _Reads(dict[str, tuple[HeldClaim, ...]]):
    """Claims by node that count how often each node's are read: the point of keeping
    counts is not reading them again."""

    def __init__(self, claims: dict[str, tuple[HeldClaim, ...]]) -> None:
        super().__init__(claims)
        self.reads: Counter[str] = Counter()

    def get(self, node_id: str, default: object = None) -> tuple[HeldClaim, ...]:  # type: ignore[override]
        self.reads[node_id] += 1
        return super().get(node_id, ())

    def __call__(self, node_id: str) -> tuple[HeldClaim, ...]:
        return self.get(node_id)


def _gpu_key() -> Key:
    return (frozenset({"gpu"}), False, None, None)


def test_kept_counts_are_counted_once_and_a_touch_recounts_only_its_nodes() -> None:
    pool = (gpu_node("a", gpus=2), gpu_node("b", gpus=4))
    reads = _Reads({})
    counts = FreeCounts(pool, reads)
    order = counts.window(frozenset(), 0, 10)
    first = [(f, n) for f, n, _ in order.candidates(_gpu_key(), _refusal, {}, 1)[2]]
    assert first == [(2, "a"), (4, "b")]
    assert reads.reads == {"a": 1, "b": 1}
    again = [(f, n) for f, n, _ in order.candidates(_gpu_key(), _refusal, {}, 1)[2]]
    assert again == first and reads.reads == {"a": 1, "b": 1}
    counts.touch(["b"])
    assert reads.reads == {"a": 1, "b": 2}


def test_a_touch_recounts_every_eligible_node_however_many_are_not() -> None:
    # Nodes that are not eligible under a key (down, or not in the pool at all) are
    # skipped, never the end of the recount: the eligible node's new count shows.
    down = tuple(gpu_node(f"d{i}", state=replace(READY, reachable=False)) for i in range(30))
    pool = (*down, gpu_node("a", gpus=2), gpu_node("b", gpus=2))
    bookings: dict[str, tuple[HeldClaim, ...]] = {}
    counts = FreeCounts(pool, lambda n: bookings.get(n, ()))
    counts.index(_gpu_key(), _refusal)
    bookings["a"] = tuple(
        HeldClaim(a.atom_id, a.claim, Holder("r", False)) for a in pool[30].atoms[1:2]
    )
    counts.touch([*(n.node_id for n in down), "gone", "a"])
    assert counts.index(_gpu_key(), _refusal).order == [(1, "a"), (2, "b")]


def test_irregular_nodes_are_counted_once_per_window_until_touched() -> None:
    pool = (gpu_node("a", gpus=2), gpu_node("b", gpus=3))
    counts = FreeCounts(pool, lambda n: ())
    held = _Reads({})
    listed = [
        [(f, n) for f, n, _ in counts.window(frozenset({"a", "b"}), 0, 10).candidates(
            _gpu_key(), _refusal, held, 1
        )[2]]
        for _ in range(2)
    ]  # fmt: skip
    assert listed == [[(2, "a"), (3, "b")]] * 2
    assert held.reads == {"a": 1, "b": 1}
    counts.touch(["a"])
    list(counts.window(frozenset({"a", "b"}), 0, 10).candidates(_gpu_key(), _refusal, held, 1)[2])
    assert held.reads == {"a": 2, "b": 1}
