"""One pool's nodes and live bookings held in memory, as the placer reads them for a
window: bookings indexed by node and resolved to claims on physical devices (`claims`),
each node's free counts under all its bookings (`free_index`, recounted only for the
nodes a booking touches), and the window's view of it (`build_snapshot`). A batch of
bookings works on a `SnapshotDraft`, a private fork of the cache to which each booking
it decides is added. Pure: `coordinator.ledger.snapshot` fills it from the database.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from itertools import islice
from operator import itemgetter
from typing import Any
from weakref import ref

from coordinator.domain.booking_spans import BookingSpans
from coordinator.domain.claims import form_of, stale_claim
from coordinator.domain.free_index import FreeCounts
from coordinator.domain.placement_model import (
    AtomSlot,
    HeldClaim,
    Holder,
    NodeSlot,
    PoolSnapshot,
)

# Windows whose irregular nodes are kept (`PoolCache.outside`).
_KEPT_WINDOWS = 32


@dataclass(frozen=True, slots=True)
class HeldAtom:
    atom_id: str
    node_id: str
    cls: str
    reservation_id: str
    spot: bool
    start: int
    end: int
    # The physical device of the atom; "" until the cache fills it in (`committed`).
    device_id: str = ""
    # The device's partition when it was booked (`claims.form_of`), as its claim rows
    # say; "" for a booking of this process's, made on the current partition.
    form: str = ""


@dataclass(frozen=True, slots=True)
class HeldScalar:
    node_id: str  # "" for a pool-level booking
    resource: str
    amount: int
    reservation_id: str
    spot: bool
    start: int
    end: int


_Row = tuple[int, int, str, HeldClaim]  # (start, end, reservationId, claim)


@dataclass(frozen=True, slots=True)
class _NodeClaims:
    """One node's claims, ascending by start (stable: in the order they were added), so
    that a window reads only those starting before it ends. A pool whose nodes hold
    bookings for weeks ahead otherwise scanned each node's every claim for every count
    (issue 30 point 8: 32-client creates 7x slower with 20 future days booked)."""

    rows: tuple[_Row, ...]
    starts: tuple[int, ...]  # the rows' starts, for bisect
    claims: tuple[HeldClaim, ...]  # the rows' claims, in the rows' order
    latest_start: int
    earliest_end: int

    def extended(self, rows: list[_Row]) -> _NodeClaims:
        """These claims and `rows` (after them where they start alike)."""
        if not rows:
            return self
        # Two sorted runs (the new ones usually sorted already): timsort merges them.
        merged = sorted((*self.rows, *rows), key=itemgetter(0))
        ends = [r[1] for r in rows]
        if self.rows:
            ends.append(self.earliest_end)
        return _NodeClaims(
            tuple(merged),
            tuple(r[0] for r in merged),
            tuple(r[3] for r in merged),
            merged[-1][0],
            min(ends),
        )

    def window(self, start: int, end: int, ignore: frozenset[str]) -> tuple[HeldClaim, ...]:
        if not ignore and self.latest_start < end and self.earliest_end > start:
            return self.claims  # all of them overlap: the usual case, answered at once
        before = bisect_left(self.starts, end)  # the rest start at or after `end`
        return tuple(
            held
            for s, e, rid, held in islice(self.rows, before)
            if e > start and not (ignore and rid in ignore)
        )


_NO_CLAIMS = _NodeClaims((), (), (), 0, 0)


@dataclass
class PoolCache:
    nodes_version: int = -1
    bookings_version: int = -1
    nodes: tuple[NodeSlot, ...] = ()
    # atomId → (nodeId, atom) of every current atom; nodeId → node.
    current: dict[str, tuple[str, AtomSlot]] = field(default_factory=dict)
    by_id: dict[str, NodeSlot] = field(default_factory=dict)
    capacity_memory: int = 0
    by_node: dict[str, list[HeldAtom]] = field(default_factory=dict)
    # nodeId → its bookings' claims, resolved against the current atoms when first asked
    # for; extended as bookings are added, dropped when nodes or bookings are reloaded.
    resolved: dict[str, _NodeClaims] = field(default_factory=dict)
    atoms: list[HeldAtom] = field(default_factory=list)
    scalars: list[HeldScalar] = field(default_factory=list)
    # When each atom booking starts and ends: the nodes with a booking outside a window,
    # whose kept free counts do not hold for it.
    spans: BookingSpans = field(default_factory=BookingSpans)
    # Per-node free counts under all bookings (`free_index`); None until first asked for
    # after nodes or bookings were (re)loaded.
    counts: FreeCounts | None = None
    # Copy on write: a fork shares the lists above with the cache it was forked from
    # until either adds to them. `owned` names the nodes whose `by_node` list this cache
    # made itself since the last fork; `owns_lists`, whether `atoms`, `scalars` and
    # `spans` are its own.
    owned: set[str] = field(default_factory=set)
    owns_lists: bool = True
    # (start, end) → the nodes with a booking outside that window (`irregular`), for
    # the windows asked about since the last reload, kept up to date as bookings are
    # added: a batch's requests come back to the same few windows, and collecting them
    # from every booking of the pool for each request cost more than placing it. Each
    # cache's own: a fork starts with copies of those asked about since this cache was
    # forked (`asked`), as collecting them again for every batch cost more than copying
    # the sets, and keeping every window ever asked about up to date cost more still.
    outside: dict[tuple[int, int], set[str]] = field(default_factory=dict)
    asked: set[tuple[int, int]] = field(default_factory=set)

    def fork(self) -> PoolCache:
        """A copy whose bookings can grow without touching this one, nor this one's
        later growth touching it (nodes are shared: they are immutable). Nothing is
        copied up front: each side copies a list the first time it adds to it, so a
        batch of bookings copies the lists of the few nodes it books, not the pool's."""
        self.owned = set()
        self.owns_lists = False
        fork = replace(
            self,
            by_node=dict(self.by_node),
            resolved=dict(self.resolved),
            counts=None,
            owned=set(),
            owns_lists=False,
            outside={w: set(self.outside[w]) for w in self.asked if w in self.outside},
            asked=set(),
        )
        if self.counts is not None:
            fork.counts = self.counts.fork(_ClaimsOf(fork))
        return fork

    def add(self, atoms: list[HeldAtom], scalars: list[HeldScalar]) -> None:
        """New bookings of this process's (pinned to their devices, `pinned`)."""
        if not self.owns_lists:
            self.atoms, self.scalars = list(self.atoms), list(self.scalars)
            self.spans = self.spans.copy()
            self.owns_lists = True
        pinned = [self.pinned(h) for h in atoms]
        self.atoms.extend(pinned)
        self.index(pinned)
        self.scalars.extend(scalars)

    def index(self, atoms: Iterable[HeldAtom]) -> None:
        """Index bookings added to `atoms` (all of them after a reload, when nothing is
        shared with another cache: `add` copies what is)."""
        touched: dict[str, list[HeldAtom]] = {}
        held = list(atoms)
        for h in held:
            touched.setdefault(h.node_id, []).append(h)
        self.spans.add((h.start, h.end, h.node_id) for h in held)
        for node_id, new in touched.items():
            mine = self.by_node.get(node_id)
            if mine is None or node_id not in self.owned:
                mine = self.by_node[node_id] = [*(mine or ()), *new]
                self.owned.add(node_id)
            else:
                mine.extend(new)
            # The node's resolved claims, if any, gain the new ones' rows: resolving all
            # of them again would give the same rows, in the same order.
            found = self.resolved.get(node_id)
            if found is not None:
                self.resolved[node_id] = found.extended(self._rows(new))
        if self.outside:
            for (start, end), outside in self.outside.items():
                for h in held:
                    if h.end <= start or h.start >= end:
                        outside.add(h.node_id)
        if self.counts is not None:
            self.counts.touch(
                touched, {n: [(h.start, h.end) for h in new] for n, new in touched.items()}
            )

    def pinned(self, h: HeldAtom) -> HeldAtom:
        """A new booking of this process's with its atom's device and that device's
        partition as they are now: should the atom be retired, or the device
        repartitioned, later, the booking still claims the device."""
        if h.device_id or h.atom_id not in self.current:
            return h
        node_id, atom = self.current[h.atom_id]
        node = self.by_id.get(node_id)
        device = atom.device_id
        if not device:
            form = ""
        elif node is not None:
            form = node.form(device)
        else:
            form = form_of(())
        return HeldAtom(
            h.atom_id, h.node_id, h.cls, h.reservation_id, h.spot, h.start, h.end, device, form
        )

    def _same_form(self, h: HeldAtom) -> bool:
        """Whether `h` was booked on its device's current partition."""
        if not h.form or not h.device_id:
            return True
        node = self.by_id.get(h.node_id)
        current = node.form(h.device_id) if node is not None else form_of(())
        return current == h.form

    def reset(self) -> None:
        """Nodes or bookings were reloaded: every resolved claim and count is stale."""
        self.resolved = {}
        self.counts = None
        self.outside = {}
        self.asked = set()

    def all_claims(self, node_id: str) -> tuple[HeldClaim, ...]:
        return self.claims(node_id).claims if node_id in self.by_node else ()

    def free_counts(self) -> FreeCounts:
        if self.counts is None:
            self.counts = FreeCounts(self.nodes, _ClaimsOf(self))
        return self.counts

    def irregular(self, start: int, end: int) -> AbstractSet[str]:
        """Nodes with a booking the window [start, end) does not overlap (as the cache
        holds them until a booking is added: read it before adding one)."""
        self.asked.add((start, end))
        found = self.outside.get((start, end))
        if found is None:
            if len(self.outside) >= _KEPT_WINDOWS:
                del self.outside[next(iter(self.outside))]
            found = self.outside[(start, end)] = self.spans.outside(start, end)
        return found

    def claims(self, node_id: str) -> _NodeClaims:
        """A booking on a current atom claims what that atom is; one on an atom that left
        the inventory (or the pool), or on a partition its device no longer has (an atom
        id can outlive a repartition: slot 0 of 2 is slot 0 of 4), claims its whole
        device, as the database's claim rows do (one partition of a device at a time)."""
        found = self.resolved.get(node_id)
        if found is None:
            found = self.resolved[node_id] = _NO_CLAIMS.extended(
                self._rows(self.by_node.get(node_id, ()))
            )
        return found

    def _rows(self, held: Iterable[HeldAtom]) -> list[_Row]:
        rows = []
        for h in held:
            atom = self.current.get(h.atom_id)
            if atom is not None and atom[0] == h.node_id and self._same_form(h):
                claim = atom[1].claim
            else:
                claim = stale_claim(h.atom_id, h.cls, h.device_id)
            rows.append(
                (
                    h.start,
                    h.end,
                    h.reservation_id,
                    HeldClaim(h.atom_id, claim, Holder(h.reservation_id, h.spot)),
                )
            )
        return rows


class _ClaimsOf:
    """A cache's `all_claims` for its free counts, held weakly: a bound method would
    make cache and counts a cycle, and a replaced cache (a reload, an adopted draft)
    would wait for the collector's full pass instead of going at once, which the
    process may keep from walking long-lived objects (`runtime.heap`)."""

    __slots__ = ("_cache",)

    def __init__(self, cache: PoolCache) -> None:
        self._cache = ref(cache)

    def __call__(self, node_id: str) -> tuple[HeldClaim, ...]:
        cache = self._cache()
        if cache is None:  # counts live inside their cache: never seen
            raise ReferenceError("free counts outlived their pool cache")
        return cache.all_claims(node_id)


class PoolView:
    """The cached pool, seen for any window (`booking.PoolWindows`)."""

    def __init__(self, cache: PoolCache) -> None:
        self.cache = cache
        self.version = cache.bookings_version

    def snapshot(self, start: int, end: int) -> PoolSnapshot:
        return build_snapshot(self.cache, start, end, frozenset())

    def node(self, node_id: str) -> NodeSlot:
        return self.cache.by_id[node_id]

    def reserved_atoms(self, now: int) -> ReservedAtoms:
        """Atoms that already count as `reserved` (a booking starts after now)."""
        return ReservedAtoms(self.cache, now)


class ReservedAtoms(AbstractSet[str]):
    """Atoms with a booking that starts after `now`, as the cache holds them (bookings
    added later included). A booking asks about its own few atoms: each is looked up
    among its node's bookings, not by collecting the whole pool's."""

    def __init__(self, cache: PoolCache, now: int) -> None:
        self._cache, self._now = cache, now

    def __contains__(self, atom_id: object) -> bool:
        where = self._cache.current.get(atom_id) if isinstance(atom_id, str) else None
        held = self._cache.by_node.get(where[0], ()) if where else self._cache.atoms
        return any(h.atom_id == atom_id and h.start > self._now for h in held)

    def _all(self) -> set[str]:
        return {h.atom_id for h in self._cache.atoms if h.start > self._now}

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


class SnapshotDraft(PoolView):
    """One pool's bookings as a batch of bookings sees them: what was committed, plus
    each booking of the batch decided so far (none of it visible to anyone else)."""

    def add(self, atoms: list[HeldAtom], scalars: list[HeldScalar]) -> None:
        self.cache.add(atoms, scalars)


class WindowClaims(Mapping[str, tuple[HeldClaim, ...]]):
    """nodeId → the claims of its bookings overlapping one window, computed when the
    placer asks for a node rather than for every booking of the pool up front."""

    def __init__(self, cache: PoolCache, start: int, end: int, ignore: frozenset[str]) -> None:
        self._cache, self._start, self._end, self._ignore = cache, start, end, ignore

    def _claims(self, node_id: str) -> tuple[HeldClaim, ...]:
        if node_id not in self._cache.by_node:
            return ()
        return self._cache.claims(node_id).window(self._start, self._end, self._ignore)

    def __getitem__(self, node_id: str) -> tuple[HeldClaim, ...]:
        return self._claims(node_id)

    def get(self, node_id: str, default: Any = None) -> Any:
        return self._claims(node_id) or default

    def __iter__(self) -> Iterator[str]:
        return iter(self._cache.by_node)

    def __len__(self) -> int:
        return len(self._cache.by_node)


def build_snapshot(cache: PoolCache, start: int, end: int, ignore: frozenset[str]) -> PoolSnapshot:
    per_node: dict[str, dict[str, list[tuple[int, Holder]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    events: list[tuple[int, int]] = []
    for sc in cache.scalars:
        if not (sc.start < end and sc.end > start) or sc.reservation_id in ignore:
            continue
        if sc.node_id:
            per_node[sc.node_id][sc.resource].append(
                (sc.amount, Holder(sc.reservation_id, sc.spot))
            )
        if sc.resource == "memoryGiB":
            events.append((max(sc.start, start), sc.amount))
            events.append((min(sc.end, end), -sc.amount))
    # Free pool memory at the window's busiest instant, node-level and pool-level alike.
    peak = level = 0
    for _, delta in sorted(events):
        level += delta
        peak = max(peak, level)
    return PoolSnapshot(
        cache.nodes,
        held=WindowClaims(cache, start, end, ignore),
        scalar_holders={
            node: {r: tuple(v) for r, v in res.items()} for node, res in per_node.items()
        },
        pool_free={"memoryGiB": max(0, cache.capacity_memory - peak)},
        # With reservations ignored (a change of one's own booking) the kept counts,
        # which include them, do not hold: the placer counts.
        order=None
        if ignore
        else cache.free_counts().window(cache.irregular(start, end), start, end),
    )
