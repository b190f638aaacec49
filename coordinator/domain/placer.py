"""The placer: filter → per-node device selection (topology, sharing, selectors) →
scalar resources → score → rank; gangs over a node label; whole-node bindings.

An atom is free in the window when it is healthy and no booking in the window holds a
conflicting claim on its device (`claims`): a booking on another form of the same GPU or
NIC, on a form that no longer exists, or on the whole node takes it too.

Scoring packs: a node scores higher the fewer free atoms of the requested classes it has
left after the placement, so a stream of small requests fills partly used nodes before
breaking into whole ones, and within a node atoms of small NVLink cliques go before
those of large ones. Ties break on nodeId, so the result is deterministic.

`topology: nvlink-all` on the request puts every GPU of every device entry (those not
marked `any` themselves) in one clique; on a device entry, that entry's GPUs. A clique
is a set of GPUs every pair of which shares an NVLink (`cliques`).

Every node turned away is counted under the reason it was turned away for, as it is
filtered (`Placement.filtered`, after Nomad's AllocMetric), and the shortfall messages
are written from those counts and from the most each device entry found free on one node.

`ignore_spot=True` places as if spot bookings were gone; the picks then carry the spot
reservations that would have to be preempted: those holding the atoms it takes, and
for scalar resources the fewest spot holders that cover what is missing.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable

from coordinator.domain.claims import Claim, conflicts
from coordinator.domain.cliques import bits, maximal_cliques
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

PROFILE_MISMATCH = "profile mismatch"
PARTLY_BOOKED = "node is partly booked in the window"
POOL_MEMORY = "the pool's uncommitted memory is less than the node's"
NOT_TOGETHER = "fits alone, not together with the other devices on one node"
_NONE: frozenset[str] = frozenset()


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


def _nvlink(d: DeviceRequest, req: PlacementRequest) -> bool:
    return d.cls == "gpu" and (d.topology or req.topology) == "nvlink-all"


def _group(req: PlacementRequest) -> list[int]:
    """Device entries that share the request-wide clique."""
    if req.topology != "nvlink-all":
        return []
    return [i for i, d in enumerate(req.devices) if d.cls == "gpu" and d.topology != "any"]


def _short_key(d: DeviceRequest, req: PlacementRequest) -> str:
    if _nvlink(d, req):
        return f"too few NVLink-connected free {d.cls}"
    return f"too few free matching {d.cls}"


def covered(node: NodeSlot, claim: Claim) -> Iterable[AtomSlot]:
    """The node's current atoms a held claim takes."""
    if claim.device is None:
        return node.atoms
    return (a for a in node.by_device.get(claim.device, ()) if conflicts(a.claim, claim))


def _cliques(atoms: list[AtomSlot]) -> list[list[AtomSlot]]:
    """Maximal sets of pairwise NVLink-connected atoms, smallest first, then by ids."""
    if all(a.peers is None for a in atoms) and len({a.claim.device for a in atoms}) == len(atoms):
        # No link matrix, one atom per device: atoms sharing a clique label are linked,
        # so the label groups (and each unlabelled atom alone) are the maximal cliques.
        groups: dict[tuple[bool, str], list[AtomSlot]] = defaultdict(list)
        for a in atoms:
            groups[(a.clique is None, a.clique or a.atom_id)].append(a)
        return sorted(groups.values(), key=lambda c: (len(c), sorted(a.atom_id for a in c)))
    n = len(atoms)
    adjacency = [0] * n
    for i in range(n):
        for j in range(i + 1, n):
            a, b = atoms[i], atoms[j]
            if a.linked(b) and b.linked(a) and not conflicts(a.claim, b.claim):
                adjacency[i] |= 1 << j
                adjacency[j] |= 1 << i
    found = [[atoms[k] for k in bits(m)] for m in maximal_cliques(adjacency)]
    return sorted(found, key=lambda c: (len(c), sorted(a.atom_id for a in c)))


class _NodeView:
    """One node's free atoms and free scalars for a window."""

    def __init__(self, node: NodeSlot, snap: PoolSnapshot, ignore_spot: bool) -> None:
        self.node = node
        # Atoms held by someone we may not preempt, and which spot reservations hold each
        # of the others. For whole nodes: is anything on it, a form that no longer exists
        # included, held by someone we may not preempt, and which spot reservations hold
        # anything on it.
        blocked_atoms: set[str] = set()
        self.victims: dict[str, set[str]] = {}
        self.blocked = False
        self.all_victims: set[str] = set()
        for held in snap.held.get(node.node_id, ()):
            spot = ignore_spot and held.holder.spot
            if spot:
                self.all_victims.add(held.holder.reservation_id)
            else:
                self.blocked = True
            for atom in covered(node, held.claim):
                if spot:
                    self.victims.setdefault(atom.atom_id, set()).add(held.holder.reservation_id)
                else:
                    blocked_atoms.add(atom.atom_id)
        self.free = [a for a in node.atoms if a.healthy and a.atom_id not in blocked_atoms]
        self.pool_memory_free = snap.pool_free.get("memoryGiB")
        # Free scalars once every spot holder we may preempt is gone, and those holders.
        self.scalar_free: dict[str, int] = {}
        self.scalar_spot: dict[str, dict[str, int]] = {}
        scalars = snap.scalar_holders.get(node.node_id, {})
        for resource, capacity in node.capacity.items():
            used = 0
            spot_amounts: dict[str, int] = {}
            for amount, holder in scalars.get(resource, ()):
                if ignore_spot and holder.spot:
                    rid = holder.reservation_id
                    spot_amounts[rid] = spot_amounts.get(rid, 0) + amount
                else:
                    used += amount
            self.scalar_free[resource] = max(0, capacity - used)
            self.scalar_spot[resource] = spot_amounts

    def _pool(self, d: DeviceRequest, taken: dict[str | None, list[Claim]]) -> list[AtomSlot]:
        """Free atoms matching `d` that do not collide with what the request took."""
        out = []
        for a in self.free:
            if not _matches(a, d):
                continue
            if taken and (
                taken.get(None) or any(conflicts(a.claim, c) for c in taken.get(a.claim.device, ()))
            ):
                continue
            out.append(a)
        return out

    def _choose(self, pool: list[AtomSlot], count: int) -> list[AtomSlot]:
        """`count` atoms of `pool` that do not collide with each other: small cliques
        first; when preempting, atoms that notice the fewest new spot holders first."""
        sizes = Counter(a.clique for a in pool)
        ordered = sorted(
            pool, key=lambda a: (sizes[a.clique] if a.clique else 0, a.clique or "", a.atom_id)
        )
        chosen: list[AtomSlot] = []
        noticed: set[str] = set()
        while len(chosen) < count:
            best: AtomSlot | None = None
            best_new = -1
            for a in ordered:
                if any(conflicts(a.claim, c.claim) for c in chosen):
                    continue
                new = len(self.victims.get(a.atom_id, _NONE) - noticed) if self.victims else 0
                if best is None or new < best_new:
                    best, best_new = a, new
                    if new == 0:
                        break
            if best is None:
                break
            chosen.append(best)
            ordered.remove(best)
            noticed |= self.victims.get(best.atom_id, _NONE)
        return chosen

    def _assign(
        self, entries: list[tuple[int, DeviceRequest]], clique: list[AtomSlot]
    ) -> list[AtomSlot] | None:
        """Atoms of one clique for every slot of the entries (a bipartite matching, so
        overlapping selectors can't starve each other), or None."""
        prefer = self._choose(clique, len(clique))
        slots = [d for _, d in entries for _ in range(d.count)]
        owner: dict[str, int] = {}

        def augment(s: int, seen: set[str]) -> bool:
            for a in prefer:
                if a.atom_id in seen or not _matches(a, slots[s]):
                    continue
                seen.add(a.atom_id)
                if a.atom_id not in owner or augment(owner[a.atom_id], seen):
                    owner[a.atom_id] = s
                    return True
            return False

        for s in range(len(slots)):
            if not augment(s, set()):
                return None
        return [a for a in prefer if a.atom_id in owner]

    def _best_clique(
        self, entries: list[tuple[int, DeviceRequest]], pool: list[AtomSlot]
    ) -> list[AtomSlot] | None:
        need = sum(d.count for _, d in entries)
        best: tuple[int, int, list[AtomSlot]] | None = None
        for clique in _cliques(pool):
            if len(clique) < need:
                continue
            got = self._assign(entries, clique)
            if got is None:
                continue
            noticed = len(set().union(*(self.victims.get(a.atom_id, set()) for a in got)))
            if best is None or noticed < best[0]:
                best = (noticed, len(clique), got)
            if noticed == 0:
                break
        return None if best is None else best[2]

    def pick_devices(self, req: PlacementRequest) -> tuple[list[AtomSlot] | None, int | None, str]:
        """Atoms for every device entry, or (None, failing index, reason)."""
        taken: dict[str | None, list[Claim]] = defaultdict(list)
        picked: list[AtomSlot] = []

        def take(atoms: list[AtomSlot]) -> None:
            picked.extend(atoms)
            for a in atoms:
                taken[a.claim.device].append(a.claim)

        group = _group(req)
        joint = sum(req.devices[i].count for i in group) > 1
        if joint:
            entries = [(i, req.devices[i]) for i in group]
            pool = [a for a in self.free if any(_matches(a, d) for _, d in entries)]
            chosen = self._best_clique(entries, pool)
            if chosen is None:
                return None, group[0], "too few NVLink-connected free gpu for the whole request"
            take(chosen)
        for i, d in enumerate(req.devices):
            if joint and i in group:
                continue
            pool = self._pool(d, taken)
            if _nvlink(d, req) and d.count > 1:
                got = self._best_clique([(i, d)], pool)
                if got is None:
                    return None, i, _short_key(d, req)
                chosen = got
            else:
                chosen = self._choose(pool, d.count)
                if len(chosen) < d.count:
                    return None, i, _short_key(d, req)
            take(chosen)
        return picked, None, ""

    def most_free(self, d: DeviceRequest, req: PlacementRequest) -> int:
        """Free atoms matching `d` on the node, or its largest NVLink clique of them."""
        pool = [a for a in self.free if _matches(a, d)]
        if _nvlink(d, req):
            return max((len(c) for c in _cliques(pool)), default=0)
        return len(pool)

    def largest_clique(self, req: PlacementRequest, group: list[int]) -> int:
        entries = [req.devices[i] for i in group]
        pool = [a for a in self.free if any(_matches(a, d) for d in entries)]
        return max((len(c) for c in _cliques(pool)), default=0)

    def scalar_victims(
        self, resources: Iterable[tuple[str, int]], noticed: frozenset[str]
    ) -> tuple[frozenset[str], str | None]:
        """The spot holders to notice so that every scalar fits (beyond `noticed`, whose
        share is freed anyway): per resource, the fewest holders that cover the gap,
        largest first, then by id. Or the first resource that can't fit at all."""
        out = set(noticed)
        for resource, amount in resources:
            if amount <= 0:
                continue
            free = self.scalar_free.get(resource, 0)
            if free < amount:
                return frozenset(out), resource
            spot = self.scalar_spot.get(resource, {})
            missing = amount - free + sum(a for r, a in spot.items() if r not in out)
            for rid, held in sorted(spot.items(), key=lambda x: (-x[1], x[0])):
                if missing <= 0:
                    break
                if rid not in out:
                    out.add(rid)
                    missing -= held
        return frozenset(out), None


class _Metric:
    """What filtering saw: nodes turned away per reason, the most each device entry (and
    the request-wide clique, and each scalar) found free on one eligible node."""

    def __init__(self, req: PlacementRequest) -> None:
        self.filtered: Counter[str] = Counter()
        self.eligible = 0
        self.best = [0] * len(req.devices)
        self.group_best = 0
        self.scalar_best: dict[str, int] = {}

    def observe(self, view: _NodeView, req: PlacementRequest, group: list[int]) -> None:
        for i, d in enumerate(req.devices):
            self.best[i] = max(self.best[i], view.most_free(d, req))
        if len(group) > 1:
            self.group_best = max(self.group_best, view.largest_clique(req, group))
        for resource, _ in req.resources:
            free = view.scalar_free.get(resource, 0)
            self.scalar_best[resource] = max(self.scalar_best.get(resource, 0), free)


def _eligible(node: NodeSlot, req: PlacementRequest, metric: _Metric) -> bool:
    bucket = node_bucket(node.state)
    if bucket != "allocatable":
        metric.filtered[f"not allocatable: {bucket}"] += 1
        return False
    if (req.profile_id is not None and node.profile_id != req.profile_id) or (
        req.profile_version is not None and node.profile_version != req.profile_version
    ):
        metric.filtered[PROFILE_MISMATCH] += 1
        return False
    metric.eligible += 1
    return True


def _fit(view: _NodeView, req: PlacementRequest) -> tuple[NodePick | None, int | None, str]:
    node = view.node
    if req.whole_node:
        # Nothing else may hold any atom of it in the window, a faulty GPU included; it
        # books every atom, so one that recovers mid-window is still its own.
        scalars_free = all(view.scalar_free[r] >= c for r, c in node.capacity.items())
        if view.blocked or not scalars_free:
            return None, None, PARTLY_BOOKED
        memory = node.capacity.get("memoryGiB", 0)
        if view.pool_memory_free is not None and memory > view.pool_memory_free:
            return None, None, POOL_MEMORY
        devices, index, reason = view.pick_devices(req)
        if devices is None:
            return None, index, reason
        whole_victims = view.all_victims.union(*view.scalar_spot.values())
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
    noticed = frozenset().union(*(view.victims.get(a.atom_id, set()) for a in devices))
    victims, short = view.scalar_victims(req.resources, noticed)
    if short is not None:
        return None, None, f"too little free {short}"
    classes = {d.cls for d in req.devices}
    left = sum(1 for a in view.free if a.cls in classes) - len(devices)
    pick = NodePick(
        node.node_id,
        tuple(devices),
        tuple((r, a) for r, a in req.resources if a > 0),
        score=round(1.0 / (1 + left), 6),
        victims=victims,
    )
    return pick, None, ""


def _rank(picks: Iterable[NodePick]) -> list[NodePick]:
    return sorted(picks, key=lambda p: (-p.score, p.node_id))


def _free_count(node: NodeSlot, snap: PoolSnapshot, classes: set[str], ignore_spot: bool) -> int:
    """Free healthy atoms of the requested classes, the packing key: the node's healthy
    count less what the window's claims take, so an unbooked node costs one lookup."""
    free = node.healthy(classes)
    held = snap.held.get(node.node_id)
    if not held:
        return free
    gone: set[str] = set()
    by_device = node.by_device
    for h in held:
        if ignore_spot and h.holder.spot:
            continue
        claim = h.claim
        if claim.device is None:
            return 0
        part = claim.part
        for atom in by_device.get(claim.device, ()):
            # `conflicts`, inlined: this runs for every booked node of the pool.
            if part is not None and atom.claim.part not in (None, part):
                continue
            if atom.healthy and atom.cls in classes and atom.atom_id not in gone:
                gone.add(atom.atom_id)
                free -= 1
    return free


def place(
    req: PlacementRequest,
    snap: PoolSnapshot,
    *,
    ignore_spot: bool = False,
    limit: int = MAX_CANDIDATES,
) -> Placement:
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
    metric = _Metric(req)
    eligible = [n for n in snap.nodes if _eligible(n, req, metric)]
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
            counted = sorted(
                (_free_count(n, snap, classes, ignore_spot), n.node_id, n) for n in eligible
            )
            order = [c for c in counted if c[0] >= need]
            few = len(counted) - len(order)
            if few:
                metric.filtered[f"too few free {'/'.join(sorted(classes))}"] += few
        picks: list[NodePick] = []
        tried = Counter[str]()
        for _, _, node in order:
            pick, _, reason = _fit(_NodeView(node, snap, ignore_spot), req)
            if pick is None:
                tried[reason] += 1
                continue
            picks.append(pick)
            if len(picks) == limit:
                break
        if picks:
            ranked = _rank(picks)
            filtered = dict(metric.filtered + tried)
            return Placement(True, tuple(ranked), victims=ranked[0].victims, filtered=filtered)
        # Nothing fits: look at every eligible node again, recording why each fails.
        metric = _Metric(req)
        eligible = [n for n in snap.nodes if _eligible(n, req, metric)]
    group = _group(req)
    picks = []
    for node in eligible:
        view = _NodeView(node, snap, ignore_spot)
        pick, _, reason = _fit(view, req)
        if pick is None:
            metric.filtered[reason] += 1
            if req.gang_size == 1:
                metric.observe(view, req, group)
        else:
            picks.append(pick)
    if req.gang_size > 1:
        return _place_gang(req, snap, picks, metric)
    shortfalls, reason = _shortfalls(req, snap, metric, group)
    return Placement(False, shortfalls=shortfalls, reason=reason, filtered=dict(metric.filtered))


def _pool_short(req: PlacementRequest, snap: PoolSnapshot) -> tuple[str, int, int] | None:
    """Pool-wide commitments (interval reservations of memory) bound what every member
    together may take."""
    for resource, amount in req.resources:
        asked = amount * max(1, req.gang_size)
        free = snap.pool_free.get(resource)
        if free is not None and asked > free:
            return resource, free, asked
    return None


def _place_gang(
    req: PlacementRequest, snap: PoolSnapshot, picks: list[NodePick], metric: _Metric
) -> Placement:
    labels = {n.node_id: n.labels for n in snap.nodes}
    key = req.gang_key
    domains: dict[str, list[NodePick]] = defaultdict(list)
    for pick in picks:
        if key is None:
            domains["*"].append(pick)
        elif key in labels[pick.node_id]:
            domains[labels[pick.node_id][key]].append(pick)
        else:
            metric.filtered[f"no {key} label"] += 1
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
        return Placement(
            True, tuple(best_members), victims=victims, gang=True, filtered=dict(metric.filtered)
        )
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
        filtered=dict(metric.filtered),
    )


def _summary(filtered: Counter[str]) -> str:
    parts = sorted(filtered.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
    return ", ".join(f"{reason} on {n} node{'s' if n > 1 else ''}" for reason, n in parts)


def _shortfalls(
    req: PlacementRequest, snap: PoolSnapshot, metric: _Metric, group: list[int]
) -> tuple[tuple[Shortfall, ...], str]:
    """The answer to "why not", read off what filtering recorded."""
    if not snap.nodes:
        reason = "the pool has no nodes"
    elif not metric.eligible:
        if metric.filtered[PROFILE_MISMATCH]:
            reason = f"no allocatable node with profile {req.profile_id}"
        else:
            reason = "no allocatable node in the pool"
    else:
        head = "no whole node is free" if req.whole_node else "no node can take the whole request"
        reason = f"{head}: {_summary(metric.filtered)}"
    # Node-level reasons (not about one device entry), most frequent first.
    node_level = sorted(
        (
            (n, r)
            for r, n in metric.filtered.items()
            if r in (PARTLY_BOOKED, POOL_MEMORY) or r.startswith("too little free ")
        ),
        key=lambda x: (-x[0], x[1]),
    )
    need = sum(req.devices[i].count for i in group)
    out: list[Shortfall] = []
    for i, d in enumerate(req.devices):
        available = metric.best[i]
        if not metric.eligible:
            why = reason
        elif available < d.count:
            kind = "NVLink-connected " if _nvlink(d, req) else ""
            why = f"at most {available} free {kind}{d.cls} matching on one node"
        elif i in group and len(group) > 1 and metric.group_best < need:
            why = (
                f"at most {metric.group_best} NVLink-connected free gpu on one node, "
                f"{need} asked for the whole request"
            )
        elif node_level:
            why = _node_level_message(req, metric, node_level[0][1])
        else:
            why = NOT_TOGETHER
        out.append(Shortfall(i, d.cls, d.count, available, why))
    return tuple(out), reason


def _node_level_message(req: PlacementRequest, metric: _Metric, key: str) -> str:
    if key.startswith("too little free "):
        resource = key.removeprefix("too little free ")
        asked = dict(req.resources).get(resource, 0)
        best = metric.scalar_best.get(resource, 0)
        return f"at most {best} {resource} free on one node in the window, {asked} asked"
    return key
