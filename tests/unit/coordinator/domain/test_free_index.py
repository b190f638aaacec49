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


# A pool's bookings as the window tests below keep them: nodeId → (start, end, GPU).
Gpus = dict[str, list[tuple[int, int, int]]]


class _Pool:
    """GPU nodes and their bookings, counted by the kept counts and afresh."""

    def __init__(self, sizes: dict[str, int]) -> None:
        self.nodes = {n: gpu_node(n, gpus=size) for n, size in sizes.items()}
        self.booked: Gpus = {n: [] for n in sizes}

    def claims(self, node_id: str, start: int = -1, end: int = 10**9) -> tuple[HeldClaim, ...]:
        gpus = self.nodes[node_id].atoms[1:]
        return tuple(
            HeldClaim(gpus[g].atom_id, gpus[g].claim, Holder(f"r{s}-{g}", False))
            for s, e, g in self.booked[node_id]
            if s < end and e > start
        )

    def book(self, node_id: str, start: int, end: int, gpu: int) -> None:
        self.booked[node_id].append((start, end, gpu))

    def counts(self) -> FreeCounts:
        return FreeCounts(tuple(self.nodes.values()), self.claims)

    def held(self, start: int, end: int) -> dict[str, tuple[HeldClaim, ...]]:
        return {n: self.claims(n, start, end) for n in self.nodes}

    def irregular(self, start: int, end: int) -> frozenset[str]:
        return frozenset(
            n
            for n, spans in self.booked.items()
            for s, e, _ in spans
            if not (s < end and e > start)
        )

    def listed(
        self, counts: FreeCounts, start: int, end: int, need: int
    ) -> tuple[int, list[tuple[int, str]]]:
        order = counts.window(self.irregular(start, end), start, end)
        _, few, found = order.candidates(_gpu_key(), _refusal, self.held(start, end), need)
        return few, [(f, n) for f, n, _ in found]

    def recount(self, start: int, end: int, need: int) -> tuple[int, list[tuple[int, str]]]:
        counted = sorted(
            (free_among(node, self.claims(n, start, end), {"gpu"}, False), n)
            for n, node in self.nodes.items()
        )
        return sum(1 for c in counted if c[0] < need), [c for c in counted if c[0] >= need]


def _irregular_pool(each: int) -> _Pool:
    """For the window [10, 20) and a need of 2, `each` irregular nodes of every kind: `r`
    (fewer than 2 free under all its bookings, 3 in the window), `b` (3 free under all,
    4 in the window), `f` (fewer than 2 in the window too); and regular nodes `g`."""
    pool = _Pool(
        {
            **{f"r{i:02}": 3 for i in range(each)},
            **{f"b{i:02}": 4 for i in range(each)},
            **{f"f{i:02}": 2 for i in range(each)},
            **{f"g{i}": 4 for i in range(3)},
        }
    )
    for i in range(each):
        pool.book(f"r{i:02}", 20, 30, 0)
        pool.book(f"r{i:02}", 0, 10, 1)
        pool.book(f"b{i:02}", 30, 40, i % 4)
        pool.book(f"f{i:02}", 10, 20, 0)
        pool.book(f"f{i:02}", 25, 35, 1)
    for i in range(3):
        pool.book(f"g{i}", 5, 15, i)
    return pool


def test_touching_many_nodes_recounts_each_whichever_kept_its_count() -> None:
    # A batch's bookings touch many nodes at once, some whose count did not move (a
    # booking outside every counted class): each of the others shows its new count.
    pool = _Pool({f"n{i:02}": 2 for i in range(20)})
    counts = pool.counts()
    counts.index(_gpu_key(), _refusal)
    for i in range(1, 20, 2):
        pool.book(f"n{i:02}", 0, 10, 0)
    counts.touch(pool.nodes)
    assert counts.index(_gpu_key(), _refusal).order == (
        pool.counts().index(_gpu_key(), _refusal).order
    )


def test_bookings_added_beside_a_window_keep_its_counts_and_one_inside_moves_them() -> None:
    """Windows are half-open: a booking that ends when the window starts, or starts when
    it ends, leaves the window's counts as they are (not read again); one inside it is
    counted in."""
    pool = _Pool({"a": 4, "b": 4})
    pool.book("a", 30, 40, 0)  # irregular for [10, 20)
    counts = pool.counts()
    held = _Reads(pool.held(10, 20))
    order = counts.window(pool.irregular(10, 20), 10, 20)

    def listed() -> tuple[int, list[tuple[int, str]]]:
        _, few, found = order.candidates(_gpu_key(), _refusal, held, 1)
        return few, [(f, n) for f, n, _ in found]

    assert listed() == (0, [(4, "a"), (4, "b")]) and held.reads["a"] == 1
    # The last of these leaves `a` no GPU free under all its bookings, all 4 in the
    # window: still a candidate, not one of the nodes with too few.
    for start, end, gpu in ((20, 30, 1), (0, 10, 2), (25, 35, 3)):
        pool.book("a", start, end, gpu)
        counts.touch(["a"], {"a": [(start, end)]})
        assert listed() == (0, [(4, "a"), (4, "b")]) and held.reads["a"] == 1
    pool.book("a", 15, 25, 1)
    counts.touch(["a"], {"a": [(15, 25)]})
    held.update(pool.held(10, 20))
    assert listed() == (0, [(3, "a"), (4, "b")]) and held.reads["a"] == 2


def test_a_window_with_many_irregular_nodes_of_each_kind_lists_every_fitting_one() -> None:
    # More new irregular nodes than are inserted one by one are sorted in at once.
    pool = _irregular_pool(20)
    counts = pool.counts()
    for need in (2, 2, 1, 3):
        assert pool.listed(counts, 10, 20, need) == pool.recount(10, 20, need)


def test_a_node_that_is_no_longer_irregular_for_a_window_is_listed_once() -> None:
    # The caller's bookings replaced wholesale (the kept counts unmoved): a node whose
    # booking now lies inside the window is no longer irregular, and counts once.
    pool = _irregular_pool(3)
    counts = pool.counts()
    assert pool.listed(counts, 10, 20, 2) == pool.recount(10, 20, 2)
    pool.booked["b01"] = [(10, 20, 1)]
    pool.booked["r00"] = [(10, 20, 0), (12, 18, 1)]
    assert pool.listed(counts, 10, 20, 2) == pool.recount(10, 20, 2)


def test_a_pool_asked_about_more_windows_than_it_keeps_answers_each_one() -> None:
    pool = _irregular_pool(2)
    counts = pool.counts()
    windows = [(10, 20 + i) for i in range(40)]
    for start, end in [*windows, *windows[:3]]:
        assert pool.listed(counts, start, end, 2) == pool.recount(start, end, 2)


def test_the_eligible_nodes_of_a_window_are_known_before_any_candidate_is_asked_for() -> None:
    down = gpu_node("d", state=replace(READY, reachable=False))
    counts = FreeCounts((gpu_node("a"), down, gpu_node("b")), lambda n: ())
    eligible = counts.window(frozenset(), 0, 10).eligible(_gpu_key(), _refusal, {})
    assert [(free, n.node_id) for free, n in eligible] == [(8, "a"), (8, "b")]


def test_a_fork_of_sorted_windows_moves_apart_from_its_origin() -> None:
    """A batch drafts on a fork: bookings it adds inside a window (on irregular nodes of
    every kind) show in the fork's candidates and never in the origin's."""
    pool = _irregular_pool(3)
    counts = pool.counts()
    before = pool.recount(10, 20, 2)
    assert pool.listed(counts, 10, 20, 2) == before
    origin = {n: list(spans) for n, spans in pool.booked.items()}
    twin = counts.fork(pool.claims)
    added = {"f00": (12, 18, 1), "r01": (10, 20, 2), "b02": (15, 16, 0), "g0": (10, 20, 3)}
    for node_id, (start, end, gpu) in added.items():
        pool.book(node_id, start, end, gpu)
    twin.touch(added, {n: [(s, e)] for n, (s, e, _) in added.items()})
    assert pool.listed(twin, 10, 20, 2) == pool.recount(10, 20, 2) != before
    pool.booked = origin
    assert pool.listed(counts, 10, 20, 2) == before
