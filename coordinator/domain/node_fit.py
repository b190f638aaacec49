"""Device selection on one node for one window: which atoms are free, which of them a
request takes (selectors, sharing, NVLink cliques, no two forms of one device), and
which spot holders taking them would notice.

An atom is free in the window when it is healthy and no booking in the window holds a
conflicting claim on its device (`claims`): a booking on another form of the same GPU or
NIC, on a form that no longer exists, or on the whole node takes it too.

`topology: nvlink-all` on the request puts every GPU of every device entry (those not
marked `any` themselves) in one clique; on a device entry, that entry's GPUs. A clique
is a set of GPUs every pair of which shares an NVLink (`cliques`). Within a node, atoms
of small cliques go before those of large ones.

A GPU in unbooked use (a process no booking covers, as the use join last saw it) is free
but goes last: its atoms are chosen only when idle ones do not fit (`busy_atoms`).

With spot bookings ignored (`ignore_spot`), a pick notices the spot holders of the
atoms it takes, choosing atoms that notice the fewest, and for scalar resources the
fewest spot holders that cover what is missing.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Set
from operator import attrgetter

from coordinator.domain.claims import Claim, conflicts
from coordinator.domain.gpu_use_units import unit_of
from coordinator.domain.placement_model import (
    AtomSlot,
    DeviceRequest,
    HeldClaim,
    NodeSlot,
    PlacementRequest,
    PoolSnapshot,
)
from coordinator.domain.states import node_bucket
from shared.cliques import bits, maximal_cliques

_NONE: frozenset[str] = frozenset()
_ATOM_ID = attrgetter("atom_id")
# (node, unit UUID) pairs in unbooked use: what the placer is told is busy.
BusyUnits = Set[tuple[str, str]]


def busy_atoms(node: NodeSlot, busy: BusyUnits) -> frozenset[str]:
    """The node's atoms whose unit (GPU or MIG instance) is in unbooked use."""
    if not busy:
        return _NONE
    node_id = node.node_id
    return frozenset(
        a.atom_id
        for a in node.atoms
        if (node_id, unit_of(a.cls, a.atom_id, a.device_id, a.attrs)) in busy
    )


def matches(atom: AtomSlot, d: DeviceRequest) -> bool:
    if atom.cls != d.cls:
        return False
    if not d.selector and d.cls != "gpu.slot":
        return True
    if d.cls == "gpu.slot" and d.sharing in ("timeslice", "mps"):
        if atom.attrs.get("sharing") not in (None, d.sharing):
            return False
    for key, allowed in d.selector:
        value = atom.attrs.get(key)
        if not any(value == v or str(value) == str(v) for v in allowed):
            return False
    return True


def nvlink(d: DeviceRequest, req: PlacementRequest) -> bool:
    return d.cls == "gpu" and (d.topology or req.topology) == "nvlink-all"


def clique_group(req: PlacementRequest) -> list[int]:
    """Device entries that share the request-wide clique."""
    if req.topology != "nvlink-all":
        return []
    return [i for i, d in enumerate(req.devices) if d.cls == "gpu" and d.topology != "any"]


def _short_key(d: DeviceRequest, req: PlacementRequest) -> str:
    if nvlink(d, req):
        return f"too few NVLink-connected free {d.cls}"
    return f"too few free matching {d.cls}"


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


def busy_allocatable(nodes: Iterable[NodeSlot], busy: BusyUnits) -> int:
    """How many allocatable whole GPUs (a healthy `gpu` atom on an allocatable node) of
    `nodes` are in unbooked use: what the rollup says beside its gpu row."""
    return sum(
        1
        for n in nodes
        if node_bucket(n.state) == "allocatable"
        for a in n.atoms
        if a.cls == "gpu" and a.healthy and a.atom_id in busy_atoms(n, busy)
    )


class NodeView:
    """One node's free atoms and free scalars for a window."""

    def __init__(
        self, node: NodeSlot, snap: PoolSnapshot, ignore_spot: bool, busy: BusyUnits = frozenset()
    ) -> None:
        self.node = node
        self.busy = busy_atoms(node, busy)
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
            for atom in node.covered(held.claim):
                if spot:
                    self.victims.setdefault(atom.atom_id, set()).add(held.holder.reservation_id)
                else:
                    blocked_atoms.add(atom.atom_id)
        self.free = [a for a in node.atoms if a.healthy and a.atom_id not in blocked_atoms]
        self.pool_memory_free = snap.pool_free.get("memoryGiB")
        # Free scalars once every spot holder we may preempt is gone, and those holders.
        self.scalar_free: dict[str, int] = {}
        self.scalar_spot: dict[str, dict[str, int]] = {}
        scalars = snap.scalar_holders.get(node.node_id)
        if not scalars:
            # Nothing holds the node's scalars in the window (the usual case).
            for resource, capacity in node.capacity.items():
                self.scalar_free[resource] = max(0, capacity)
                self.scalar_spot[resource] = {}
            return
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

    def _pool(
        self, entries: list[DeviceRequest], taken: dict[str | None, list[Claim]]
    ) -> list[AtomSlot]:
        """Free atoms matching any of `entries` that do not collide with what the request
        took."""
        out = []
        only = entries[0] if len(entries) == 1 else None
        for a in self.free:
            if not (matches(a, only) if only else any(matches(a, d) for d in entries)):
                continue
            if taken and (
                taken.get(None) or any(conflicts(a.claim, c) for c in taken.get(a.claim.device, ()))
            ):
                continue
            out.append(a)
        return out

    def _choose(self, pool: list[AtomSlot], count: int) -> list[AtomSlot]:
        """`count` atoms of `pool` that do not collide with each other: small cliques
        first, atoms in unbooked use last; when preempting, atoms that notice the fewest
        new spot holders first."""
        busy = self.busy
        if not busy and len({a.clique for a in pool}) < 2:
            # One clique (or none) and nothing busy: the order below is by atom id.
            ordered = sorted(pool, key=_ATOM_ID)
        else:
            sizes = Counter(a.clique for a in pool)
            ordered = sorted(
                pool,
                key=lambda a: (
                    a.atom_id in busy,
                    sizes[a.clique] if a.clique else 0,
                    a.clique or "",
                    a.atom_id,
                ),
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
                if a.atom_id in seen or not matches(a, slots[s]):
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
        best: tuple[tuple[int, int], list[AtomSlot]] | None = None
        for clique in _cliques(pool):
            if len(clique) < need:
                continue
            got = self._assign(entries, clique)
            if got is None:
                continue
            noticed = len(set().union(*(self.victims.get(a.atom_id, set()) for a in got)))
            cost = (noticed, sum(a.atom_id in self.busy for a in got))
            if best is None or cost < best[0]:
                best = (cost, got)
            if cost == (0, 0):
                break
        return None if best is None else best[1]

    def pick_devices(self, req: PlacementRequest) -> tuple[list[AtomSlot] | None, int | None, str]:
        """Atoms for every device entry, or (None, failing index, reason)."""
        taken: dict[str | None, list[Claim]] = defaultdict(list)
        picked: list[AtomSlot] = []

        def take(atoms: list[AtomSlot]) -> None:
            picked.extend(atoms)
            for a in atoms:
                taken[a.claim.device].append(a.claim)

        group = clique_group(req)
        joint = sum(req.devices[i].count for i in group) > 1
        if joint:
            entries = [(i, req.devices[i]) for i in group]
            pool = [a for a in self.free if any(matches(a, d) for _, d in entries)]
            chosen = self._best_clique(entries, pool)
            if chosen is None:
                return None, group[0], "too few NVLink-connected free gpu for the whole request"
            take(chosen)
        rest = [(i, d) for i, d in enumerate(req.devices) if not (joint and i in group)]
        clique_took = len(picked)
        for i, d in rest:
            pool = self._pool([d], taken)
            if nvlink(d, req) and d.count > 1:
                got = self._best_clique([(i, d)], pool)
                if got is None:
                    return None, i, _short_key(d, req)
                chosen = got
            else:
                chosen = self._choose(pool, d.count)
                if len(chosen) < d.count:
                    kept = picked[:clique_took]
                    if (together := self._match_apart(rest, req, kept)) is None:
                        return None, i, _short_key(d, req)
                    return [*kept, *together], None, ""
            take(chosen)
        return picked, None, ""

    def _match_apart(
        self,
        entries: list[tuple[int, DeviceRequest]],
        req: PlacementRequest,
        kept: list[AtomSlot],
    ) -> list[AtomSlot] | None:
        """Atoms for every slot of these entries at once, beside `kept` (what the
        request's clique took), where taking them one entry after another ran short: an
        earlier entry may have taken the atom only a later one's selector admits (any
        GPU, then an H100, of one H100 and one A100). Matched as a clique's entries are
        (`_assign`); entries that want their own NVLink clique are left to the
        entry-by-entry answer."""
        if len(entries) < 2 or any(nvlink(d, req) and d.count > 1 for _, d in entries):
            return None
        taken: dict[str | None, list[Claim]] = defaultdict(list)
        for a in kept:
            taken[a.claim.device].append(a.claim)
        return self._assign(entries, self._pool([d for _, d in entries], taken))

    def most_free(self, d: DeviceRequest, req: PlacementRequest) -> int:
        """Free atoms matching `d` on the node, or its largest NVLink clique of them."""
        pool = [a for a in self.free if matches(a, d)]
        if nvlink(d, req):
            return max((len(c) for c in _cliques(pool)), default=0)
        return len(pool)

    def largest_clique(self, req: PlacementRequest, group: list[int]) -> int:
        entries = [req.devices[i] for i in group]
        pool = [a for a in self.free if any(matches(a, d) for d in entries)]
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
            # A loaded node's capacity names each scalar a request may ask for.
            free = self.scalar_free[resource]
            if free < amount:
                return frozenset(out), resource
            spot = self.scalar_spot[resource]
            missing = amount - free + sum(a for r, a in spot.items() if r not in out)
            for rid, held in sorted(spot.items(), key=lambda x: (-x[1], x[0])):
                if missing <= 0:
                    break
                if rid not in out:
                    out.add(rid)
                    missing -= held
        return frozenset(out), None


def free_count(node: NodeSlot, snap: PoolSnapshot, classes: set[str], ignore_spot: bool) -> int:
    """Free healthy atoms of the requested classes in the snapshot's window, the packing
    key."""
    return free_among(node, snap.held.get(node.node_id) or (), classes, ignore_spot)


def free_among(
    node: NodeSlot, held: tuple[HeldClaim, ...], classes: Set[str], ignore_spot: bool
) -> int:
    """Free healthy atoms of `classes` under `held`: the node's healthy count less what
    the claims take, so an unbooked node costs one lookup."""
    free = node.healthy(classes)
    if not held:
        return free
    gone: set[str] = set()
    covering = node.covering
    for h in held:
        if ignore_spot and h.holder.spot:
            continue
        claim = h.claim
        if claim.device is None:
            return 0
        # What the claim takes by the one rule (`claims.conflicts`), as the database
        # applies it; found once per node and claim (`NodeSlot.covered`).
        taken = covering.get((claim.device, claim.part))
        for atom in node.covered(claim) if taken is None else taken:
            if atom.healthy and atom.cls in classes:
                gone.add(atom.atom_id)
    return free - len(gone)
