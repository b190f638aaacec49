"""A pool as the placer needs it for one window — nodes, atoms, and who holds what —
served from memory and kept honest by per-pool version counters in the database.

Bookings are indexed by node and resolved to claims on physical devices (`claims`): a
booking on an atom that is no longer in the inventory (a GPU re-partitioned, a NIC's VFs
changed) still claims its device, so the device's new forms are not free under it. Each
GPU atom carries the devices it shares an NVLink with, from the link matrix of the
node's stored inventory (`cliques.peer_sets`).

Loading 9,000 atoms with their JSON attributes costs tens of milliseconds, so the
snapshot cache keeps, per pool, the nodes and atoms (keyed by `nodes_version`) and the
live bookings (keyed by `bookings_version`). Every transaction that changes either bumps
its counter; a reader compares counters (one primary-key read) and reloads only the part
that moved. Inside a booking transaction the counters are read after the pool lock is
taken, so the placer sees exactly what the database holds.

The cache also keeps each node's free counts under all its bookings (`free_index`),
recounting only the nodes of each committed booking, so the placer need not count the
whole fleet per request; for a window, nodes with a booking outside it are named
(`irregular`) and recounted against the window's own claims.

A batch of bookings works on a `SnapshotDraft` — a private fork of the pool's cache,
free counts included, to which each booking it decides is added — and the cache adopts
the draft once the batch has committed.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.domain.claims import NODE_DEVICE, form_of, stale_claim
from coordinator.domain.free_index import FreeCounts
from coordinator.domain.model import NodeState
from coordinator.domain.placement_model import (
    AtomSlot,
    HeldClaim,
    Holder,
    NodeSlot,
    PoolSnapshot,
    healthy_counts,
)
from coordinator.domain.states import node_bucket
from coordinator.ledger import schema
from shared.cliques import peer_sets

_FAULTY = ("unhealthy", "unmonitored")
KEEP_ENDED_MS = 5 * 60 * 1000
# Up to this many new bookings are inserted into the sorted bounds one by one (a
# booking's few atoms: each batch member indexes its own); more are sorted in.
_INSERT_IN_PLACE = 64


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


@dataclass(frozen=True, slots=True)
class _NodeClaims:
    rows: tuple[tuple[int, int, str, HeldClaim], ...]  # (start, end, reservationId, claim)
    claims: tuple[HeldClaim, ...]
    latest_start: int
    earliest_end: int

    def window(self, start: int, end: int, ignore: frozenset[str]) -> tuple[HeldClaim, ...]:
        if not ignore and self.latest_start < end and self.earliest_end > start:
            return self.claims  # all of them overlap: the usual case, answered at once
        return tuple(
            held
            for s, e, rid, held in self.rows
            if s < end and e > start and not (ignore and rid in ignore)
        )


@dataclass
class _PoolCache:
    nodes_version: int = -1
    bookings_version: int = -1
    nodes: tuple[NodeSlot, ...] = ()
    # atomId → (nodeId, atom) of every current atom; nodeId → node.
    current: dict[str, tuple[str, AtomSlot]] = field(default_factory=dict)
    by_id: dict[str, NodeSlot] = field(default_factory=dict)
    capacity_memory: int = 0
    by_node: dict[str, list[HeldAtom]] = field(default_factory=dict)
    # nodeId → its bookings' claims, resolved against the current atoms when first asked
    # for; dropped whenever atoms or bookings change.
    resolved: dict[str, _NodeClaims] = field(default_factory=dict)
    atoms: list[HeldAtom] = field(default_factory=list)
    scalars: list[HeldScalar] = field(default_factory=list)
    # (end, nodeId) and (start, nodeId) of every atom booking, ascending: the nodes with
    # a booking outside a window, whose kept free counts do not hold for it.
    ends: list[tuple[int, str]] = field(default_factory=list)
    starts: list[tuple[int, str]] = field(default_factory=list)
    # Per-node free counts under all bookings (`free_index`); None until first asked for
    # after nodes or bookings were (re)loaded.
    counts: FreeCounts | None = None

    def fork(self) -> _PoolCache:
        """A copy whose bookings can grow without touching this one (nodes are shared:
        they are immutable)."""
        fork = replace(
            self,
            by_node={node: list(held) for node, held in self.by_node.items()},
            resolved=dict(self.resolved),
            atoms=list(self.atoms),
            scalars=list(self.scalars),
            ends=list(self.ends),
            starts=list(self.starts),
            counts=None,
        )
        if self.counts is not None:
            fork.counts = self.counts.fork(fork.all_claims)
        return fork

    def index(self, atoms: Iterable[HeldAtom]) -> None:
        touched = set()
        held = list(atoms)
        # A few new bookings (one reservation of a batch) go in place; a reload sorts.
        few = len(held) <= _INSERT_IN_PLACE
        for h in held:
            self.by_node.setdefault(h.node_id, []).append(h)
            self.resolved.pop(h.node_id, None)
            if few:
                insort(self.ends, (h.end, h.node_id))
                insort(self.starts, (h.start, h.node_id))
            else:
                self.ends.append((h.end, h.node_id))
                self.starts.append((h.start, h.node_id))
            touched.add(h.node_id)
        if not few:
            # Sorted runs plus a new one: timsort merges them.
            self.ends.sort()
            self.starts.sort()
        if self.counts is not None:
            self.counts.touch(touched)

    def pinned(self, h: HeldAtom) -> HeldAtom:
        """A new booking of this process's with its atom's device and that device's
        partition as they are now: should the atom be retired, or the device
        repartitioned, later, the booking still claims the device."""
        if h.device_id or h.atom_id not in self.current:
            return h
        node_id, atom = self.current[h.atom_id]
        node = self.by_id.get(node_id)
        atoms = node.by_device.get(atom.device_id, ()) if node is not None else ()
        form = form_of(a.atom_id for a in atoms) if atom.device_id else ""
        return replace(h, device_id=atom.device_id, form=form)

    def _same_form(self, h: HeldAtom, forms: dict[str, str]) -> bool:
        """Whether `h` was booked on its device's current partition (`forms` caches the
        node's current ones by device)."""
        if not h.form or not h.device_id:
            return True
        current = forms.get(h.device_id)
        if current is None:
            node = self.by_id.get(h.node_id)
            atoms = node.by_device.get(h.device_id, ()) if node is not None else ()
            current = forms[h.device_id] = form_of(a.atom_id for a in atoms)
        return current == h.form

    def reset(self) -> None:
        """Nodes or bookings were reloaded: every resolved claim and count is stale."""
        self.resolved = {}
        self.counts = None

    def all_claims(self, node_id: str) -> tuple[HeldClaim, ...]:
        return self.claims(node_id).claims if node_id in self.by_node else ()

    def free_counts(self) -> FreeCounts:
        if self.counts is None:
            self.counts = FreeCounts(self.nodes, self.all_claims)
        return self.counts

    def irregular(self, start: int, end: int) -> frozenset[str]:
        """Nodes with a booking the window [start, end) does not overlap."""
        ended = self.ends[: bisect_left(self.ends, (start + 1,))]
        later = self.starts[bisect_left(self.starts, (end,)) :]
        return frozenset(n for _, n in ended) | frozenset(n for _, n in later)

    def claims(self, node_id: str) -> _NodeClaims:
        """A booking on a current atom claims what that atom is; one on an atom that left
        the inventory (or the pool), or on a partition its device no longer has (an atom
        id can outlive a repartition: slot 0 of 2 is slot 0 of 4), claims its whole
        device, as the database's claim rows do (one partition of a device at a time)."""
        found = self.resolved.get(node_id)
        if found is None:
            rows = []
            forms: dict[str, str] = {}
            for h in self.by_node.get(node_id, ()):
                atom = self.current.get(h.atom_id)
                if atom is not None and atom[0] == h.node_id and self._same_form(h, forms):
                    claim = atom[1].claim
                else:
                    claim = stale_claim(h.atom_id, h.cls, h.device_id)
                held = HeldClaim(h.atom_id, claim, Holder(h.reservation_id, h.spot))
                rows.append((h.start, h.end, h.reservation_id, held))
            found = self.resolved[node_id] = _NodeClaims(
                tuple(rows),
                tuple(r[3] for r in rows),
                max((r[0] for r in rows), default=0),
                min((r[1] for r in rows), default=0),
            )
        return found


async def bump(
    conn: AsyncConnection, pool_ids: Iterable[str], *, nodes: bool = False, bookings: bool = False
) -> None:
    v = schema.pool_versions.c
    values = {}
    if nodes:
        values["nodes_version"] = v.nodes_version + 1
    if bookings:
        values["bookings_version"] = v.bookings_version + 1
    for pool_id in sorted(set(pool_ids)):
        await conn.execute(
            update(schema.pool_versions).where(v.pool_id == pool_id).values(**values)
        )


async def versions(conn: AsyncConnection, pool_id: str) -> tuple[int, int]:
    v = schema.pool_versions.c
    row = (
        await conn.execute(select(v.nodes_version, v.bookings_version).where(v.pool_id == pool_id))
    ).first()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def _links(inventory: Mapping[str, Any] | None) -> dict[str, frozenset[str]]:
    """GPU UUID → UUIDs it shares an NVLink with, from a stored inventory's `gpus`; GPUs
    the inventory does not describe are absent (their clique label stands in)."""
    gpus = (inventory or {}).get("gpus") or ()
    return peer_sets(
        (str(g["uuid"]), str(g.get("pciBusId") or ""), tuple(g.get("nvlinkPeers") or ()))
        for g in gpus
        if isinstance(g, dict) and g.get("uuid")
    )


async def _load_nodes(conn: AsyncConnection, pool_id: str) -> tuple[NodeSlot, ...]:
    n, a = schema.nodes.c, schema.atoms.c
    node_rows = (
        await conn.execute(select(schema.nodes).where(n.pool_id == pool_id).order_by(n.node_id))
    ).all()
    links = {row.node_id: _links(row.inventory) for row in node_rows}
    atoms: dict[str, list[AtomSlot]] = defaultdict(list)
    atom_rows = await conn.execute(
        select(a.atom_id, a.node_id, a["class"], a.health, a.attrs, a.device_id)
        .where((a.pool_id == pool_id) & (a.retired.is_(False)))
        .order_by(a.atom_id)
    )
    for atom_id, node_id, cls, health, attrs, device_id in atom_rows.all():
        peers = links.get(node_id, {}).get(device_id) if cls == "gpu" else None
        atoms[node_id].append(
            AtomSlot(atom_id, cls, health not in _FAULTY, dict(attrs or {}), device_id or "", peers)
        )
    return tuple(
        NodeSlot(
            node_id=row.node_id,
            state=NodeState(
                bool(row.reachable), row.health, bool(row.maintenance), bool(row.provisioning)
            ),
            labels=dict(row.labels or {}),
            profile_id=row.profile_id,
            profile_version=row.profile_version,
            atoms=tuple(atoms[row.node_id]),
            capacity={
                "vcpu": row.vcpu,
                "memoryGiB": row.memory_gib,
                "hugepages1Gi": row.hugepages_1gi,
            },
            healthy_by_class=healthy_counts(tuple(atoms[row.node_id])),
        )
        for row in node_rows
    )


async def _load_bookings(
    conn: AsyncConnection, pool_id: str, now: int
) -> tuple[list[HeldAtom], list[HeldScalar]]:
    """Bookings that end after `now` (an ended booking can hold nothing later), with the
    device of their atom, retired or not."""
    b, s, a, dc = (
        schema.bookings.c, schema.scalar_bookings.c, schema.atoms.c, schema.device_claims.c
    )  # fmt: skip
    # The partition each live booking was made on, per device (its claim rows say).
    form_rows = await conn.execute(
        select(dc.reservation_id, dc.node_id, dc.device, dc.form)
        .distinct()
        .where(
            dc.reservation_id.in_(
                select(b.reservation_id).where((b.pool_id == pool_id) & (b.end > now))
            )
            & (dc.device != NODE_DEVICE)
        )
    )
    forms = {(r[0], r[1], r[2]): r[3] for r in form_rows.all()}
    atom_rows = await conn.execute(
        select(b.atom_id, b.node_id, b["class"], b.reservation_id, b.spot, b.start, b.end)
        .add_columns(a.device_id)
        .select_from(schema.bookings.outerjoin(schema.atoms, a.atom_id == b.atom_id))
        .where((b.pool_id == pool_id) & (b.end > now) & (b.end > b.start))
    )
    scalar_rows = await conn.execute(
        select(s.node_id, s.resource, s.amount, s.reservation_id, s.spot, s.start, s.end).where(
            (s.pool_id == pool_id) & (s.end > now) & (s.end > s.start)
        )
    )
    return (
        [
            HeldAtom(
                r[0],
                r[1],
                r[2],
                r[3],
                bool(r[4]),
                int(r[5]),
                int(r[6]),
                r[7] or "",
                forms.get((r[3], r[1], r[7] or ""), ""),
            )
            for r in atom_rows.all()
        ],
        [
            HeldScalar(r[0], r[1], int(r[2]), r[3], bool(r[4]), int(r[5]), int(r[6]))
            for r in scalar_rows.all()
        ],
    )


class SnapshotCache:
    def __init__(self) -> None:
        self._pools: dict[str, _PoolCache] = {}
        self.reloads = 0

    async def snapshot(
        self,
        conn: AsyncConnection,
        pool_id: str,
        start: int,
        end: int,
        now: int,
        ignore_reservations: frozenset[str] = frozenset(),
    ) -> PoolSnapshot:
        cache = await self._fresh(conn, pool_id, now)
        return build_snapshot(cache, start, end, ignore_reservations)

    async def draft(self, conn: AsyncConnection, pool_id: str, now: int) -> SnapshotDraft:
        """A private copy of the pool as the database holds it, to which a batch of
        bookings adds each booking as it is decided (call under the pool lock)."""
        return SnapshotDraft((await self._fresh(conn, pool_id, now)).fork())

    async def _fresh(self, conn: AsyncConnection, pool_id: str, now: int) -> _PoolCache:
        cache = self._pools.setdefault(pool_id, _PoolCache())
        nodes_v, bookings_v = await versions(conn, pool_id)
        if cache.nodes_version != nodes_v:
            cache.nodes = await _load_nodes(conn, pool_id)
            cache.current = {a.atom_id: (n.node_id, a) for n in cache.nodes for a in n.atoms}
            cache.by_id = {n.node_id: n for n in cache.nodes}
            cache.reset()
            cache.capacity_memory = sum(
                n.capacity.get("memoryGiB", 0)
                for n in cache.nodes
                if node_bucket(n.state) == "allocatable"
            )
            cache.nodes_version = nodes_v
            self.reloads += 1
        if cache.bookings_version != bookings_v:
            # Keep bookings that ended a little before now: a request placed a moment
            # after its `start` was fixed must still see them.
            cache.atoms, cache.scalars = await _load_bookings(conn, pool_id, now - KEEP_ENDED_MS)
            cache.by_node, cache.ends, cache.starts = {}, [], []
            cache.reset()
            cache.index(cache.atoms)
            cache.bookings_version = bookings_v
            self.reloads += 1
        return cache

    def reserved_atoms(self, pool_id: str, now: int) -> set[str]:
        """Atoms that already count as `reserved` (a booking starts after now)."""
        return {h.atom_id for h in self._pools[pool_id].atoms if h.start > now}

    def bookings_version(self, pool_id: str) -> int:
        return self._pools[pool_id].bookings_version

    def committed(
        self,
        pool_id: str,
        bookings_version: int,
        atoms: list[HeldAtom],
        scalars: list[HeldScalar],
    ) -> None:
        """A booking transaction committed, moving the counter from `bookings_version - 1`:
        add its bookings instead of reloading them all."""
        cache = self._pools.get(pool_id)
        if cache is not None and cache.bookings_version == bookings_version - 1:
            # Remember each atom's device now: should the atom be retired later, its
            # booking still claims the device.
            atoms = [cache.pinned(h) for h in atoms]
            cache.atoms.extend(atoms)
            cache.index(atoms)
            cache.scalars.extend(scalars)
            cache.bookings_version = bookings_version

    def adopt(self, pool_id: str, draft: SnapshotDraft, booked: bool) -> None:
        """The unit of work that drafted `draft` committed (moving the bookings counter
        by one if it `booked`): the draft, claims it resolved included, becomes the
        cache — unless the cache moved on meanwhile (then it reloads when next read)."""
        cache = self._pools.get(pool_id)
        fork = draft.cache
        if cache is None or cache.bookings_version != draft.version:
            return
        if cache.nodes_version != fork.nodes_version:
            return
        fork.bookings_version = draft.version + (1 if booked else 0)
        self._pools[pool_id] = fork


class SnapshotDraft:
    """One pool's bookings as a batch of bookings sees them: what was committed, plus
    each booking of the batch decided so far (none of it visible to anyone else)."""

    def __init__(self, cache: _PoolCache) -> None:
        self.cache = cache
        self.version = cache.bookings_version

    def snapshot(self, start: int, end: int) -> PoolSnapshot:
        return build_snapshot(self.cache, start, end, frozenset())

    def reserved_atoms(self, now: int) -> set[str]:
        return {h.atom_id for h in self.cache.atoms if h.start > now}

    def add(self, atoms: list[HeldAtom], scalars: list[HeldScalar]) -> None:
        cache = self.cache
        atoms = [cache.pinned(h) for h in atoms]
        cache.atoms.extend(atoms)
        cache.index(atoms)
        cache.scalars.extend(scalars)


class WindowClaims(Mapping[str, tuple[HeldClaim, ...]]):
    """nodeId → the claims of its bookings overlapping one window, computed when the
    placer asks for a node rather than for every booking of the pool up front."""

    def __init__(self, cache: _PoolCache, start: int, end: int, ignore: frozenset[str]) -> None:
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


def build_snapshot(cache: _PoolCache, start: int, end: int, ignore: frozenset[str]) -> PoolSnapshot:
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
