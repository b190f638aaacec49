"""The placer: filter → per-node device selection (`selection`) → scalar resources →
score → rank; gangs over a node label; whole-node bindings.

Scoring packs: a node scores higher the fewer free atoms of the requested classes it has
left after the placement, so a stream of small requests fills partly used nodes before
breaking into whole ones. Ties break on nodeId, so the result is deterministic.

Every node turned away is counted under the reason it was turned away for, as it is
filtered (`Placement.filtered`, after Nomad's AllocMetric and feasibility checkers), in
one pass: a request that fits nowhere is explained from the nodes that pass judged (and
those counted out for too few free atoms, judged then), never by filtering the fleet a
second time. The shortfall messages are written from those counts and from the most each
device entry found free on one node; a caller that only asks whether a request fits
(`explain=False`) skips them.

`busy` names the GPUs in unbooked use (node, unit UUID), as the use join last saw them:
free, but taken last — within a node after its idle atoms, across nodes after every
node that fits without them (`NodePick.busy`, and the answer's warnings).

`ignore_spot=True` places as if spot bookings were gone; the picks then carry the spot
reservations that would have to be preempted, only those whose capacity they need.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable

from coordinator.domain.node_fit import BusyUnits, NodeView, clique_group, free_count, nvlink
from coordinator.domain.placement_model import (
    AtomSlot,
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
GANG_MEMORY = "gang's whole nodes together exceed the pool's uncommitted memory"
# A node showing a device (a GPU UUID, a disk's serial) another node holds (issue 31):
# the same host under a second node id, whichever admitted it; the database would refuse
# the claim, so the placer does not offer it.
DUPLICATE_DEVICES = "not allocatable: shows devices another node holds"


class _Metric:
    """What filtering saw: nodes turned away per reason, the most each device entry (and
    the request-wide clique, and each scalar) found free on one eligible node."""

    def __init__(self, req: PlacementRequest) -> None:
        self.filtered: Counter[str] = Counter()
        self.best = [0] * len(req.devices)
        self.group_best = 0
        self.scalar_best: dict[str, int] = {}

    def observe(self, view: NodeView, req: PlacementRequest, group: list[int]) -> None:
        for i, d in enumerate(req.devices):
            self.best[i] = max(self.best[i], view.most_free(d, req))
        if len(group) > 1:
            self.group_best = max(self.group_best, view.largest_clique(req, group))
        for resource, _ in req.resources:
            free = view.scalar_free[resource]
            self.scalar_best[resource] = max(self.scalar_best.get(resource, 0), free)


def _refusal(node: NodeSlot, req: PlacementRequest) -> str | None:
    """Why the node may not take the request whatever it holds, or None."""
    bucket = node_bucket(node.state)
    if bucket != "allocatable":
        return f"not allocatable: {bucket}"
    if node.duplicate_of:
        return DUPLICATE_DEVICES
    if (req.profile_id is not None and node.profile_id != req.profile_id) or (
        req.profile_version is not None and node.profile_version != req.profile_version
    ):
        return PROFILE_MISMATCH
    return None


def _eligible(node: NodeSlot, req: PlacementRequest, metric: _Metric) -> bool:
    reason = _refusal(node, req)
    if reason is not None:
        metric.filtered[reason] += 1
        return False
    return True


def _busy(view: NodeView, atoms: Iterable[AtomSlot]) -> tuple[str, ...]:
    return tuple(a.atom_id for a in atoms if a.atom_id in view.busy) if view.busy else ()


def _fit(view: NodeView, req: PlacementRequest) -> tuple[NodePick | None, int | None, str]:
    node = view.node
    if req.whole_node:
        # Nothing else may hold any atom of it in the window, a faulty GPU included; it
        # books every atom, so one that recovers mid-window is still its own.
        scalars_free = all(view.scalar_free[r] >= c for r, c in node.capacity.items())
        if view.blocked or not scalars_free:
            return None, None, PARTLY_BOOKED
        memory = node.capacity["memoryGiB"]
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
            busy=_busy(view, node.atoms),
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
        busy=_busy(view, devices),
    )
    return pick, None, ""


def _rank(picks: Iterable[NodePick]) -> list[NodePick]:
    # A node that fits without a GPU in unbooked use goes before any that needs one.
    return sorted(picks, key=lambda p: (len(p.busy), -p.score, p.node_id))


def place(
    req: PlacementRequest,
    snap: PoolSnapshot,
    *,
    ignore_spot: bool = False,
    limit: int = MAX_CANDIDATES,
    explain: bool = True,
    busy: BusyUnits = frozenset(),
) -> Placement:
    """Where `req` goes in `snap`, or (`explain`) why it goes nowhere; without
    `explain` a placement that does not fit says only that (a caller that only asks
    whether it fits). `busy`: GPUs in unbooked use, taken last."""
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
    if req.gang_size == 1:
        return _place_one(req, snap, metric, ignore_spot, limit, explain, busy)
    eligible = [n for n in snap.nodes if _eligible(n, req, metric)]
    picks = []
    for node in eligible:
        pick, _, reason = _fit(NodeView(node, snap, ignore_spot, busy), req)
        if pick is None:
            metric.filtered[reason] += 1
        else:
            picks.append(pick)
    return _place_gang(req, snap, picks, metric)


def _place_one(
    req: PlacementRequest,
    snap: PoolSnapshot,
    metric: _Metric,
    ignore_spot: bool,
    limit: int,
    explain: bool,
    busy: BusyUnits,
) -> Placement:
    """One node: try nodes by packing score, stopping at `limit` fits that take no GPU
    in unbooked use (those that do are kept, ranked after them). Each node is
    judged once: a node turned away is recorded with its reason (and its view kept), so
    a request that fits nowhere is explained from what this pass saw."""
    counted: Iterable[tuple[int, str, NodeSlot]]
    # Eligible nodes with too few free atoms of the requested classes are not tried;
    # they are judged only to explain a request that fits nowhere (with their counts).
    few_nodes: Callable[[], Iterable[tuple[int, NodeSlot]]]
    few_reason = ""
    low: list[tuple[int, NodeSlot]] = []
    if not req.whole_node and snap.order is not None:
        # Counts kept across requests (`free_index`): no pass over the fleet.
        order = snap.order
        classes = {d.cls for d in req.devices}
        key = (frozenset(classes), ignore_spot, req.profile_id, req.profile_version)

        def refusal(node: NodeSlot) -> str | None:
            return _refusal(node, req)

        refused, few, counted = order.candidates(
            key, refusal, snap.held, sum(d.count for d in req.devices)
        )
        metric.filtered.update(refused)
        if few:
            few_reason = f"too few free {'/'.join(sorted(classes))}"
            metric.filtered[few_reason] += few

        def few_nodes() -> Iterable[tuple[int, NodeSlot]]:
            return order.eligible(key, refusal, snap.held)
    else:
        # The score is a function of one number per node (free atoms of the requested
        # classes, or the node's size for whole nodes), so trying nodes in that order
        # and stopping at `limit` fits gives exactly the top `limit` without building
        # every node's view.
        eligible = [n for n in snap.nodes if _eligible(n, req, metric)]
        if req.whole_node:
            counted = sorted((len(n.atoms), n.node_id, n) for n in eligible)
        else:
            classes = {d.cls for d in req.devices}
            need = sum(d.count for d in req.devices)
            every = sorted(
                (free_count(n, snap, classes, ignore_spot), n.node_id, n) for n in eligible
            )
            counted = [c for c in every if c[0] >= need]
            low = [(c[0], c[2]) for c in every if c[0] < need]
            if low:
                few_reason = f"too few free {'/'.join(sorted(classes))}"
                metric.filtered[few_reason] += len(low)

        def few_nodes() -> Iterable[tuple[int, NodeSlot]]:
            return low

    picks: list[NodePick] = []
    idle = 0
    turned_away: list[tuple[NodeView, str]] = []
    for _, _, node in counted:
        view = NodeView(node, snap, ignore_spot, busy)
        pick, _, reason = _fit(view, req)
        if pick is None:
            turned_away.append((view, reason))
            continue
        picks.append(pick)
        idle += not pick.busy
        if idle == limit:
            break
    if picks:
        ranked = _rank(picks)[:limit]
        # Every count is positive, so a sum is needed only when nodes were turned away
        # (Counter's `+` is Python, and most bookings take the first node tried).
        filtered = metric.filtered
        if turned_away:
            filtered = filtered + Counter(reason for _, reason in turned_away)
        return Placement(True, tuple(ranked), victims=ranked[0].victims, filtered=dict(filtered))
    if not explain:
        return Placement(False)
    # Nothing fits, so every eligible node was tried or counted out: explain from the
    # nodes tried, judging only those counted out now (what each lacks, in its words).
    if few_reason:
        del metric.filtered[few_reason]
    group = clique_group(req)
    for view, reason in turned_away:
        metric.filtered[reason] += 1
        metric.observe(view, req, group)
    tried = {view.node.node_id for view, _ in turned_away}
    counted_out = [(free, node) for free, node in few_nodes() if node.node_id not in tried]
    # Refusals were counted as eligible nodes were found; these are the eligible ones.
    any_eligible = bool(turned_away or counted_out)
    _judge_few(req, snap, metric, group, ignore_spot, counted_out)
    shortfalls, reason = _shortfalls(req, snap, metric, group, any_eligible)
    return Placement(False, shortfalls=shortfalls, reason=reason, filtered=dict(metric.filtered))


def _judge_few(
    req: PlacementRequest,
    snap: PoolSnapshot,
    metric: _Metric,
    group: list[int],
    ignore_spot: bool,
    few: list[tuple[int, NodeSlot]],
) -> None:
    """Judge the nodes counted out for too few free atoms, to explain a refusal in each
    node's words and with the most any of them has free.

    On a full pool that is every node, and judging one builds its view (~27 µs): at
    1,000 nodes a refused create cost ~27 ms of the event loop, and a full pool refused
    37 creates a second. For one device entry and no scalar resources the answer needs
    less: every such node fails that entry for the same reason (it has fewer free atoms
    of the class than asked, whatever their links), and what one has free of it is at
    most its free count. So nodes are judged most free first, until none left can have
    more free than one already judged; the rest are counted under the reason judged."""
    # GPUs in unbooked use are free: they change which atoms a fit takes, never whether
    # the node fits or what it has free (so no `busy` here).
    if len(req.devices) != 1 or req.resources:
        for _, node in few:
            view = NodeView(node, snap, ignore_spot)
            metric.filtered[_fit(view, req)[2]] += 1
            metric.observe(view, req, group)
        return
    ranked = sorted(((free, n.node_id, n) for free, n in few), reverse=True)
    judged = ""
    for i, (free, _, node) in enumerate(ranked):
        if judged and free <= metric.best[0]:
            metric.filtered[judged] += len(ranked) - i
            return
        view = NodeView(node, snap, ignore_spot)
        judged = _fit(view, req)[2]
        metric.filtered[judged] += 1
        metric.observe(view, req, group)


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
    memory_free = snap.pool_free.get("memoryGiB") if req.whole_node else None
    over_memory = 0
    for name in sorted(domains):
        ranked = _rank(domains[name])
        if len(ranked) < req.gang_size:
            continue
        members = ranked[: req.gang_size]
        if memory_free is not None and _memory(members) > memory_free:
            # Whole nodes take all their memory: the gang as a whole must fit in what
            # the pool has left uncommitted, so try its smallest members.
            members = sorted(ranked, key=lambda m: (_memory([m]), -m.score, m.node_id))
            members = _rank(members[: req.gang_size])
            if _memory(members) > memory_free:
                over_memory += len(ranked)
                continue
        score = sum(m.score for m in members)
        if score > best_score:
            best_name, best_members, best_score = name, members, score
    if best_name is not None:
        victims = frozenset().union(*(m.victims for m in best_members))
        return Placement(
            True, tuple(best_members), victims=victims, gang=True, filtered=dict(metric.filtered)
        )
    where = f"one {key}" if key else "the pool"
    if over_memory and memory_free is not None:
        reason = (
            f"needs {req.gang_size} whole nodes whose memoryGiB fits in the pool's"
            f" {memory_free} uncommitted in the window"
        )
        metric.filtered[GANG_MEMORY] += over_memory
        return Placement(
            False,
            shortfalls=(Shortfall(None, "memoryGiB", req.gang_size, 0, reason),),
            reason=reason,
            gang=True,
            filtered=dict(metric.filtered),
        )
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


def _memory(members: Iterable[NodePick]) -> int:
    # Only whole-node members are weighed, whose resources are their node's capacity.
    return sum(dict(m.resources)["memoryGiB"] for m in members)


def _summary(filtered: Counter[str]) -> str:
    parts = sorted(filtered.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
    return ", ".join(f"{reason} on {n} node{'s' if n > 1 else ''}" for reason, n in parts)


def _shortfalls(
    req: PlacementRequest, snap: PoolSnapshot, metric: _Metric, group: list[int], any_eligible: bool
) -> tuple[tuple[Shortfall, ...], str]:
    """The answer to "why not", read off what filtering recorded (`any_eligible`:
    whether any node passed `_refusal`)."""
    if not snap.nodes:
        reason = "the pool has no nodes"
    elif not any_eligible:
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
        if not any_eligible:
            why = reason
        elif available < d.count:
            kind = "NVLink-connected " if nvlink(d, req) else ""
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
        # Only a requested resource is short on a node, and every node turned away was
        # observed for each requested resource.
        asked = dict(req.resources)[resource]
        best = metric.scalar_best[resource]
        return f"at most {best} {resource} free on one node in the window, {asked} asked"
    return key
