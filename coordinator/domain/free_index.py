"""Per-node free counts of one pool, kept across requests, so that the placer orders the
fleet by free capacity without counting every node's free atoms for every request
(`selection.free_count` costs ~10 µs a node: 10 ms per 1,000 nodes).

A kept count is what `free_count` answers for a window that every booking of the node
overlaps: the usual case (bookings that hold now, or start inside the window). For one
request's window, a node with a booking outside it (one that ended a moment ago, one
that starts after the window) is *irregular*: the caller names those nodes and they are
counted afresh against the window's own claims, so the order is exactly the one a full
recount would give.

Counts are kept per key (requested classes, spot ignored or not, node profile), each
index built on first use from the nodes and their claims, and recounted for the nodes
whose bookings change (`touch`), so a committed booking costs a recount of its own nodes
only. Whoever changes nodes or reloads bookings wholesale builds a new `FreeCounts`.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from heapq import heappop, heappush, merge

from coordinator.domain.node_fit import free_among
from coordinator.domain.placement_model import HeldClaim, NodeSlot

# (classes, ignore_spot, profile_id, profile_version)
Key = tuple[frozenset[str], bool, str | None, int | None]
# Why a node may not take the request at all (not allocatable, other profile), or None.
Refusal = Callable[[NodeSlot], str | None]
Candidate = tuple[int, str, NodeSlot]
# Windows whose irregular counts are kept (`FreeCounts.counted_in`).
_WINDOWS = 32
# More new irregular nodes than this are sorted in at once, fewer inserted one by one.
_INSERT_IN_PLACE = 16


@dataclass
class _Index:
    # Nodes turned away before counting, by reason.
    refused: Counter[str] = field(default_factory=Counter)
    # Eligible nodeId → free atoms of the key's classes under all its bookings.
    free: dict[str, int] = field(default_factory=dict)
    # (free, nodeId) of every eligible node, ascending: the placer's packing order.
    order: list[tuple[int, str]] = field(default_factory=list)


@dataclass
class _Irregular:
    """One window's irregular nodes sorted for one key and `need`, kept across requests
    (each node classified once, again only after a `touch`): a request must know every
    irregular node whose kept count is below its need (its count in the window decides
    whether the node fits), and re-sorting a window's hundreds of irregular nodes for
    every request cost more than placing it."""

    # Irregular nodes classified (eligible or not).
    seen: set[str] = field(default_factory=set)
    # Eligible, kept count below `need` but at least `need` in the window: (window
    # count, nodeId), ascending.
    ready: list[tuple[int, str]] = field(default_factory=list)
    # Eligible, kept count at least `need` (a lower bound of the window's): (kept,
    # nodeId), ascending; counted in the window lazily, as candidates are asked for.
    bounds: list[tuple[int, str]] = field(default_factory=list)
    # nodeId → its value in `ready` (True) or `bounds` (False), for the nodes in either
    # (an ineligible node, or one with too few free in the window, is only `seen`).
    where: dict[str, tuple[int, bool]] = field(default_factory=dict)

    def copy(self) -> _Irregular:
        return _Irregular(set(self.seen), list(self.ready), list(self.bounds), dict(self.where))

    def drop(self, node_id: str) -> None:
        """The node's counts moved: it is classified again when next asked for."""
        self.seen.discard(node_id)
        found = self.where.pop(node_id, None)
        if found is not None:
            value, ready = found
            kept = self.ready if ready else self.bounds
            del kept[bisect_left(kept, (value, node_id))]

    def classify(
        self,
        irregular: AbstractSet[str],
        free: Mapping[str, int],
        need: int,
        count: Callable[[str], tuple[int, str]],
    ) -> None:
        """Add the irregular nodes not classified yet (all of them after one left:
        the caller's bookings were replaced wholesale)."""
        if not self.seen <= irregular:
            self.seen, self.ready, self.bounds, self.where = set(), [], [], {}
        new = irregular - self.seen
        if not new:
            return
        ready: list[tuple[int, str]] = []
        bounds: list[tuple[int, str]] = []
        where = self.where
        for node_id in new:
            kept = free.get(node_id)
            if kept is None:
                continue
            if kept >= need:
                bounds.append((kept, node_id))
                where[node_id] = (kept, False)
            else:
                counted = count(node_id)[0]
                if counted >= need:
                    ready.append((counted, node_id))
                    where[node_id] = (counted, True)
        self.seen |= new
        for into, found in ((self.ready, ready), (self.bounds, bounds)):
            if len(found) > _INSERT_IN_PLACE:
                into += found
                into.sort()
            else:
                for item in found:
                    insort(into, item)


class FreeCounts:
    def __init__(
        self, nodes: Iterable[NodeSlot], claims: Callable[[str], tuple[HeldClaim, ...]]
    ) -> None:
        self._nodes = {n.node_id: n for n in nodes}
        self._claims = claims
        self._indexes: dict[Key, _Index] = {}
        # Irregular nodes' counts in recent windows, by (key, start, end): a pool's
        # requests come back to the same few windows (a slot next hour, tomorrow's
        # training run), and counting hundreds of irregular nodes again for each costs
        # more than placing. Forgotten for a node by `touch`; the oldest window goes
        # when there are more than `_WINDOWS`.
        self._window_counts: dict[tuple[Key, int, int], dict[str, int]] = {}
        # The irregular nodes of recent windows sorted, by (key, start, end, need).
        self._sorted: dict[tuple[Key, int, int, int], _Irregular] = {}

    def _count(self, key: Key, node: NodeSlot) -> int:
        return free_among(node, self._claims(node.node_id), key[0], key[1])

    def index(self, key: Key, refusal: Refusal) -> _Index:
        found = self._indexes.get(key)
        if found is None:
            found = self._indexes[key] = _Index()
            for node in self._nodes.values():
                reason = refusal(node)
                if reason is not None:
                    found.refused[reason] += 1
                else:
                    found.free[node.node_id] = self._count(key, node)
            found.order = sorted((f, n) for n, f in found.free.items())
        return found

    def fork(self, claims: Callable[[str], tuple[HeldClaim, ...]]) -> FreeCounts:
        """A copy whose counts move apart from these (a batch of bookings drafting on a
        copy of the pool), reading each node's claims through `claims`."""
        twin = FreeCounts((), claims)
        twin._nodes = self._nodes
        twin._indexes = {
            key: _Index(Counter(i.refused), dict(i.free), list(i.order))
            for key, i in self._indexes.items()
        }
        twin._window_counts = {span: dict(c) for span, c in self._window_counts.items()}
        twin._sorted = {span: kept.copy() for span, kept in self._sorted.items()}
        return twin

    def touch(
        self,
        node_ids: Iterable[str],
        added: Mapping[str, Iterable[tuple[int, int]]] | None = None,
    ) -> None:
        """The bookings of these nodes changed: recount them in every index built.
        `added`: the change was only bookings added, over these (start, end) per node;
        a window none of them overlaps keeps the node's count (its claims in the
        window are the same)."""
        nodes = set(node_ids)
        moved: set[tuple[Key, str]] = set()
        for key, index in self._indexes.items():
            for node_id in nodes:
                old = index.free.get(node_id)
                if old is None:
                    continue  # not eligible under this key, or not in the pool
                new = self._count(key, self._nodes[node_id])
                if new == old:
                    continue
                moved.add((key, node_id))
                del index.order[bisect_left(index.order, (old, node_id))]
                insort(index.order, (new, node_id))
                index.free[node_id] = new

        def within(node_id: str, start: int, end: int) -> bool:
            if added is None:
                return True
            return any(s < end and e > start for s, e in added.get(node_id, ()))

        for (_key, start, end), counted in self._window_counts.items():
            for node_id in nodes:
                if node_id in counted and within(node_id, start, end):
                    del counted[node_id]
        for (key, start, end, _), kept in self._sorted.items():
            for node_id in nodes:
                if node_id in kept.seen and (
                    (key, node_id) in moved or within(node_id, start, end)
                ):
                    kept.drop(node_id)

    def window(self, irregular: AbstractSet[str], start: int, end: int) -> WindowOrder:
        return WindowOrder(self, irregular, start, end)

    def counted_in(self, key: Key, start: int, end: int) -> dict[str, int]:
        """The irregular nodes' counts kept for this window (filled by the caller)."""
        span = (key, start, end)
        found = self._window_counts.get(span)
        if found is None:
            if len(self._window_counts) >= _WINDOWS:
                del self._window_counts[next(iter(self._window_counts))]
            found = self._window_counts[span] = {}
        return found

    def sorted_in(self, key: Key, start: int, end: int, need: int) -> _Irregular:
        """The irregular nodes kept sorted for this window and need (the caller
        classifies those not seen yet)."""
        span = (key, start, end, need)
        found = self._sorted.get(span)
        if found is None:
            if len(self._sorted) >= _WINDOWS:
                del self._sorted[next(iter(self._sorted))]
            found = self._sorted[span] = _Irregular()
        return found

    def nodes(self) -> Mapping[str, NodeSlot]:
        return self._nodes


class WindowOrder:
    """The kept counts seen from one window: `irregular` nodes are recounted."""

    def __init__(
        self, counts: FreeCounts, irregular: AbstractSet[str], start: int, end: int
    ) -> None:
        self._counts, self._irregular = counts, irregular
        self._start, self._end = start, end

    def candidates(
        self,
        key: Key,
        refusal: Refusal,
        held: Mapping[str, tuple[HeldClaim, ...]],
        need: int,
    ) -> tuple[Counter[str], int, Iterator[Candidate]]:
        """Nodes turned away by `refusal` (by reason); how many eligible nodes have
        fewer than `need` free atoms of the key's classes in the window; and the others,
        fewest free first, then by nodeId — lazily, so a caller that stops after a few
        fits never looks at the rest."""
        index = self._counts.index(key, refusal)
        nodes = self._counts.nodes()
        free = index.free
        # An irregular node's kept count takes every claim of the node, in the window or
        # not: a lower bound of its count in the window. So only those kept below `need`
        # are counted at once (they decide `few`); the others are counted lazily, in
        # the order of their bounds, as the placer asks for more candidates. With many
        # future bookings most of the pool is irregular for any one window, and the
        # placer stops after a few fits. Both kinds are kept sorted across requests
        # (`_Irregular`).
        counted = self._counts.counted_in(key, self._start, self._end)

        def count(node_id: str) -> tuple[int, str]:
            return self._count(counted, held, key, node_id), node_id

        kept = self._counts.sorted_in(key, self._start, self._end, need)
        kept.classify(self._irregular, free, need, count)
        pos = bisect_left(index.order, (need, ""))
        # Eligible nodes kept below `need`, less the irregular ones that fit the window.
        few = pos - len(kept.ready)
        skip = self._irregular
        order = index.order
        low, bounds = list(kept.ready), list(kept.bounds)

        def regular() -> Iterator[Candidate]:
            for i in range(pos, len(order)):
                free_there, node_id = order[i]
                if node_id not in skip:
                    yield free_there, node_id, nodes[node_id]

        def fitting() -> Iterator[Candidate]:
            """Irregular nodes with at least `need` free in the window, ascending by
            (free, nodeId): one is given once no node left to count can come before it
            (its bound is already past it)."""
            ready, i = low, 0  # sorted: a heap
            while ready or i < len(bounds):
                if i < len(bounds) and (not ready or bounds[i] < ready[0]):
                    heappush(ready, count(bounds[i][1]))
                    i += 1
                    continue
                free_there, node_id = heappop(ready)
                yield free_there, node_id, nodes[node_id]

        return index.refused, few, merge(regular(), fitting())

    def eligible(
        self, key: Key, refusal: Refusal, held: Mapping[str, tuple[HeldClaim, ...]]
    ) -> Iterator[tuple[int, NodeSlot]]:
        """Every node `refusal` let through under `key`, as `candidates` found them,
        with its free atoms of the key's classes in the window (the counts `candidates`
        kept, or counted now)."""
        nodes = self._counts.nodes()
        index = self._counts.index(key, refusal)
        counted = self._counts.counted_in(key, self._start, self._end)
        for node_id, kept in index.free.items():
            if node_id in self._irregular:
                kept = self._count(counted, held, key, node_id)
            yield kept, nodes[node_id]

    def _count(
        self,
        counted: dict[str, int],
        held: Mapping[str, tuple[HeldClaim, ...]],
        key: Key,
        node_id: str,
    ) -> int:
        """An irregular node's free atoms of the key's classes in the window, kept."""
        found = counted.get(node_id)
        if found is None:
            node = self._counts.nodes()[node_id]
            held_there = held.get(node_id) or ()
            found = counted[node_id] = free_among(node, held_there, key[0], key[1])
        return found
