"""The placer: filter → per-node device selection (topology, sharing, selectors) →
scalar resources → score → rank; gangs over a node label; whole-node bindings.

Scoring packs: a node scores higher the fewer free atoms of the requested classes it has
left after the placement, so a stream of small requests fills partly used nodes before
breaking into whole ones, and within a node atoms of small NVLink cliques go before
those of large ones. Ties break on nodeId, so the result is deterministic.

`ignore_spot=True` places as if spot bookings were gone; the picks then carry the spot
reservations that would have to be preempted.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping

from coordinator.domain.placement import (
    AtomSlot,
    DeviceRequest,
    NodePick,
    NodeSlot,
    Placement,
    PlacementRequest,
    PoolSnapshot,
    Shortfall,
)
from coordinator.domain.states import node_bucket

MAX_CANDIDATES = 10


def _matches(atom: AtomSlot, d: DeviceRequest) -> bool:
    if atom.cls != d.cls:
        return False
    if d.cls == "gpu.slot" and d.sharing in ("timeslice", "mps"):
        if atom.attrs.get("sharing") not in (None, d.sharing):
            return False
    for key, allowed in d.selector:
        value = atom.attrs.get(key)
        if not any(value == v or str(value) == str(v) for v in allowed):
            return False
    return True


class _NodeView:
    """One node's free atoms and free scalars for a window."""

    def __init__(self, node: NodeSlot, snap: PoolSnapshot, ignore_spot: bool) -> None:
        self.node = node
        self.free: list[AtomSlot] = []
        self.victims: dict[str, set[str]] = {}
        # For whole nodes: is any atom, healthy or not, held by someone we may not preempt,
        # and which spot reservations hold any of them.
        self.blocked = False
        self.all_victims: set[str] = set()
        for atom in node.atoms:
            holders = snap.atom_holders.get(atom.atom_id, ())
            blocking = any(not (ignore_spot and h.spot) for h in holders)
            spot = {h.reservation_id for h in holders if h.spot}
            self.blocked |= blocking
            self.all_victims |= spot
            if not atom.healthy or blocking:
                continue
            self.free.append(atom)
            self.victims[atom.atom_id] = spot
        self.pool_memory_free = snap.pool_free.get("memoryGiB")
        self.scalar_free: dict[str, int] = {}
        self.scalar_victims: dict[str, set[str]] = defaultdict(set)
        scalars = snap.scalar_holders.get(node.node_id, {})
        for resource, capacity in node.capacity.items():
            used = 0
            for amount, holder in scalars.get(resource, ()):
                if ignore_spot and holder.spot:
                    self.scalar_victims[resource].add(holder.reservation_id)
                else:
                    used += amount
            self.scalar_free[resource] = max(0, capacity - used)

    def pick_devices(self, req: PlacementRequest) -> tuple[list[AtomSlot] | None, int | None, str]:
        """Atoms for every device entry, or (None, failing index, reason)."""
        taken: set[str] = set()
        picked: list[AtomSlot] = []
        for i, d in enumerate(req.devices):
            pool = [a for a in self.free if a.atom_id not in taken and _matches(a, d)]
            topology = d.topology or req.topology
            if topology == "nvlink-all" and d.cls == "gpu" and d.count > 1:
                groups: dict[str, list[AtomSlot]] = defaultdict(list)
                for a in pool:
                    groups[a.clique or f"solo:{a.atom_id}"].append(a)
                viable = sorted(
                    (g for g in groups.values() if len(g) >= d.count),
                    key=lambda g: (len(g), g[0].clique or ""),
                )
                if not viable:
                    best = max((len(g) for g in groups.values()), default=0)
                    return None, i, f"at most {best} NVLink-connected free {d.cls} on one node"
                chosen = sorted(viable[0], key=lambda a: a.atom_id)[: d.count]
            else:
                if len(pool) < d.count:
                    return None, i, f"at most {len(pool)} free matching {d.cls} on one node"
                sizes = Counter(a.clique for a in pool)
                chosen = sorted(
                    pool,
                    key=lambda a: (sizes[a.clique] if a.clique else 0, a.clique or "", a.atom_id),
                )[: d.count]
            taken.update(a.atom_id for a in chosen)
            picked.extend(chosen)
        return picked, None, ""

    def matching_free(self, d: DeviceRequest, req: PlacementRequest) -> int:
        pool = [a for a in self.free if _matches(a, d)]
        if (d.topology or req.topology) == "nvlink-all" and d.cls == "gpu":
            counts = Counter(a.clique or a.atom_id for a in pool)
            return max(counts.values(), default=0)
        return len(pool)


def _eligible(node: NodeSlot, req: PlacementRequest) -> bool:
    if node_bucket(node.state) != "allocatable":
        return False
    if req.profile_id is not None and node.profile_id != req.profile_id:
        return False
    return req.profile_version is None or node.profile_version == req.profile_version


def _fit(view: _NodeView, req: PlacementRequest) -> tuple[NodePick | None, int | None, str]:
    node = view.node
    if req.whole_node:
        # Nothing else may hold any atom of it in the window, a faulty GPU included; it
        # books every atom, so one that recovers mid-window is still its own.
        scalars_free = all(view.scalar_free[r] >= c for r, c in node.capacity.items())
        if view.blocked or not scalars_free:
            return None, None, "node is partly booked in the window"
        memory = node.capacity.get("memoryGiB", 0)
        if view.pool_memory_free is not None and memory > view.pool_memory_free:
            return None, None, "the pool's uncommitted memory is less than the node's"
        devices, index, reason = view.pick_devices(req)
        if devices is None:
            return None, index, reason
        whole_victims = view.all_victims.union(*view.scalar_victims.values())
        pick = NodePick(
            node.node_id,
            tuple(node.atoms),
            tuple(sorted(node.capacity.items())),
            score=round(1.0 / (1 + len(node.atoms)), 6),
            victims=frozenset(whole_victims),
        )
        return pick, None, ""
    devices, index, reason = view.pick_devices(req)
    if devices is None:
        return None, index, reason
    victims: set[str] = set()
    for a in devices:
        victims |= view.victims[a.atom_id]
    for resource, amount in req.resources:
        if amount <= 0:
            continue
        if view.scalar_free.get(resource, 0) < amount:
            free = view.scalar_free.get(resource, 0)
            return None, None, f"{free} {resource} free on the node in the window, {amount} asked"
        victims |= view.scalar_victims.get(resource, set())
    classes = {d.cls for d in req.devices}
    left = sum(1 for a in view.free if a.cls in classes) - len(devices)
    pick = NodePick(
        node.node_id,
        tuple(devices),
        tuple((r, a) for r, a in req.resources if a > 0),
        score=round(1.0 / (1 + left), 6),
        victims=frozenset(victims),
    )
    return pick, None, ""


def _rank(picks: Iterable[NodePick]) -> list[NodePick]:
    return sorted(picks, key=lambda p: (-p.score, p.node_id))


def _held_index(snap: PoolSnapshot) -> Mapping[str, tuple[tuple[str, str, bool], ...]]:
    if snap.held_by_node is not None:
        return snap.held_by_node
    index: dict[str, list[tuple[str, str, bool]]] = defaultdict(list)
    for node in snap.nodes:
        for atom in node.atoms:
            if atom.atom_id in snap.atom_holders:
                index[node.node_id].append((atom.atom_id, atom.cls, atom.healthy))
    return {k: tuple(v) for k, v in index.items()}


def _free_count(
    node: NodeSlot,
    snap: PoolSnapshot,
    held: Mapping[str, tuple[tuple[str, str, bool], ...]],
    classes: set[str],
    ignore_spot: bool,
) -> int:
    """Free healthy atoms of the requested classes, the packing key: the node's healthy
    count less what is held in the window, so an unbooked node costs one lookup."""
    free = node.healthy(classes)
    for atom_id, cls, healthy in held.get(node.node_id, ()):
        if cls in classes and healthy:
            # Every listed atom has a holder in the window; only spot ones may be ignored.
            if ignore_spot and all(h.spot for h in snap.atom_holders.get(atom_id, ())):
                continue
            free -= 1
    return free


def place(
    req: PlacementRequest,
    snap: PoolSnapshot,
    *,
    ignore_spot: bool = False,
    limit: int = MAX_CANDIDATES,
) -> Placement:
    eligible = [n for n in snap.nodes if _eligible(n, req)]
    short = _pool_short(req, snap)
    if short is not None:
        resource, free, asked = short
        reason = f"{free} {resource} of the pool is uncommitted in the window, {asked} asked"
        return Placement(
            False,
            shortfalls=(Shortfall(None, resource, asked, free, reason),),
            reason=reason,
            gang=req.gang_size > 1,
        )
    if req.gang_size == 1:
        # The score is a function of one number per node (free atoms of the requested
        # classes, or the node's size for whole nodes), so trying nodes in that order
        # and stopping at `limit` fits gives exactly the top `limit` without building
        # every node's view.
        if req.whole_node:
            order = sorted((len(n.atoms), n.node_id, n) for n in eligible)
        else:
            classes = {d.cls for d in req.devices}
            need = sum(d.count for d in req.devices)
            held = _held_index(snap)
            counted = (
                (_free_count(n, snap, held, classes, ignore_spot), n.node_id, n) for n in eligible
            )
            order = sorted(c for c in counted if c[0] >= need)
        picks: list[NodePick] = []
        for _, _, node in order:
            pick, _, _ = _fit(_NodeView(node, snap, ignore_spot), req)
            if pick is not None:
                picks.append(pick)
                if len(picks) == limit:
                    break
        if picks:
            ranked = _rank(picks)
            return Placement(True, tuple(ranked), victims=ranked[0].victims)
    views = [_NodeView(n, snap, ignore_spot) for n in eligible]
    results = [(v, *_fit(v, req)) for v in views]
    if req.gang_size > 1:
        return _place_gang(req, snap, [p for _, p, _, _ in results if p is not None])
    return Placement(
        False, shortfalls=_shortfalls(req, snap, views, results), reason=_why(req, snap, views)
    )


def _pool_short(req: PlacementRequest, snap: PoolSnapshot) -> tuple[str, int, int] | None:
    """Pool-wide commitments (interval reservations of memory) bound what every member
    together may take."""
    for resource, amount in req.resources:
        asked = amount * max(1, req.gang_size)
        free = snap.pool_free.get(resource)
        if free is not None and asked > free:
            return resource, free, asked
    return None


def _place_gang(req: PlacementRequest, snap: PoolSnapshot, picks: list[NodePick]) -> Placement:
    labels = {n.node_id: n.labels for n in snap.nodes}
    key = req.gang_key
    domains: dict[str, list[NodePick]] = defaultdict(list)
    for pick in picks:
        if key is None:
            domains["*"].append(pick)
        elif key in labels[pick.node_id]:
            domains[labels[pick.node_id][key]].append(pick)
    best_name, best_members, best_score = None, [], -1.0
    for name in sorted(domains):
        ranked = _rank(domains[name])
        if len(ranked) < req.gang_size:
            continue
        members = ranked[: req.gang_size]
        score = sum(m.score for m in members)
        if score > best_score:
            best_name, best_members, best_score = name, members, score
    if best_name is not None:
        victims = frozenset().union(*(m.victims for m in best_members))
        return Placement(True, tuple(best_members), victims=victims, gang=True)
    where = f"one {key}" if key else "the pool"
    if domains:
        top_name = max(sorted(domains), key=lambda n: len(domains[n]))
        have = len(domains[top_name])
        best = f"best {key} {top_name} has {have}" if key else f"the pool has {have}"
    else:
        best = f"no {key} has any" if key else "no node fits one member"
    reason = f"needs {req.gang_size} nodes in {where}, {best}"
    return Placement(
        False,
        shortfalls=(
            Shortfall(
                None,
                None,
                req.gang_size,
                max((len(d) for d in domains.values()), default=0),
                reason,
            ),
        ),
        reason=reason,
        gang=True,
    )


def _why(req: PlacementRequest, snap: PoolSnapshot, views: list[_NodeView]) -> str:
    if not snap.nodes:
        return "the pool has no nodes"
    if not views:
        if req.profile_id is not None:
            return f"no allocatable node with profile {req.profile_id}"
        return "no allocatable node in the pool"
    if req.whole_node:
        return "no whole node is free in the window"
    return "no node can take the whole request"


def _shortfalls(
    req: PlacementRequest,
    snap: PoolSnapshot,
    views: list[_NodeView],
    results: list[tuple[_NodeView, NodePick | None, int | None, str]],
) -> tuple[Shortfall, ...]:
    out: list[Shortfall] = []
    reasons: dict[int | None, Counter[str]] = defaultdict(Counter)
    for _, pick, index, reason in results:
        if pick is None:
            reasons[index][reason] += 1
    for i, d in enumerate(req.devices):
        available = max((v.matching_free(d, req) for v in views), default=0)
        if not views:
            why = _why(req, snap, views)
        elif available < d.count:
            kind = "NVLink-connected " if (d.topology or req.topology) == "nvlink-all" else ""
            why = f"at most {available} free {kind}{d.cls} matching on one node"
        elif reasons.get(None):
            why = reasons[None].most_common(1)[0][0]
        else:
            why = "fits alone, not together with the other devices on one node"
        out.append(Shortfall(i, d.cls, d.count, available, why))
    return tuple(out)
