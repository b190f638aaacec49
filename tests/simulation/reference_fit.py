"""The reference model's placement: whether a `reservations.create` surely fits, decided
from the rows on its own rules (SPEC §5), never the placer's — which atoms a booking in
the window takes (one physical device, one promise), which nodes may take a request,
scalars, whole nodes, gangs, NVLink cliques read off the stored link matrix, and spot
holders a regular request may preempt.

It answers only where it is sure (`verdict`):
- FITS: a placement exists with every booking in the window holding (spot ones
  included), taking the sum of every overlapping scalar commitment (an upper bound of
  their peak);
- PREEMPTING: a regular request does not fit so, but does with every spot booking gone,
  over its window and the window it would move to (starting when the notice runs out),
  so whichever the ledger tries, it fits. Pool-wide memory counts spot holders' memory
  too: preemption frees a node's capacity, not the pool's (the placer notices holders
  per node);
- REFUSED: neither; NOT_JUDGED: what it does not read (a device entry's own topology).
A CAPACITY_NOT_AVAILABLE for a request judged FITS or PREEMPTING is a false refusal.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, replace

from tests.simulation.ledger_view import AtomRow, BookingRow, LedgerView, NodeRow
from tests.simulation.reference import FAULTY, Promise, collide, node_bucket, promise_of

FITS = "fits"
PREEMPTING = "fits by preempting spot holders"
REFUSED = "fits neither way"
NOT_JUDGED = "not judged"

# Device forms at booking time: (reservationId, atomId) → the ids of the atoms its device
# had then. A part booking on a device whose forms have changed since holds the whole
# device (SPEC §5: its part is not a form of the current partition).
BookedForms = dict[tuple[str, str], frozenset[str]]

_DURATION_UNITS = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


@dataclass(frozen=True, slots=True)
class Entry:
    cls: str
    count: int
    selector: tuple[tuple[str, tuple[object, ...]], ...]
    sharing: str | None
    topology: str | None = None


@dataclass(frozen=True, slots=True)
class Ask:
    """A `reservations.create` body as the reference reads it."""

    pool_id: str
    start: int
    end: int
    entries: tuple[Entry, ...]
    whole_node: bool
    nvlink: bool
    resources: tuple[tuple[str, int], ...]
    gang_size: int
    gang_key: str | None
    spot: bool = False


def ask_of(body: dict[str, object], now: int) -> Ask:
    text = str(body["duration"])
    duration = int(text[:-1]) * _DURATION_UNITS[text[-1]]
    start = max(int(body.get("start") or now), now)  # type: ignore[call-overload]
    entries = []
    for d in body.get("devices") or ():  # type: ignore[attr-defined]
        selector = tuple(
            (k, tuple(v) if isinstance(v, list | tuple) else (v,))
            for k, v in sorted((d.get("selector") or {}).items())
        )
        entries.append(
            Entry(d["class"], int(d.get("count", 1)), selector, d.get("sharing"), d.get("topology"))
        )
    gang = body.get("gang") or {}
    assert isinstance(gang, dict)
    resources = body.get("resources") or {}
    assert isinstance(resources, dict)
    return Ask(
        pool_id=str(body["poolId"]),
        start=start,
        end=start + duration,
        entries=tuple(entries),
        whole_node=body.get("binding") == "node" or any(e.cls == "node" for e in entries),
        nvlink=body.get("topology") == "nvlink-all",
        resources=tuple(sorted((str(k), int(v)) for k, v in resources.items() if v)),
        gang_size=int(gang.get("size", 1)),
        gang_key=gang.get("topologyKey"),
        spot=body.get("spot") is True,
    )


# -- NVLink, from the stored link matrix -------------------------------------------------


def gpu_links(node: NodeRow) -> dict[str, frozenset[str]]:
    """GPU UUID → the UUIDs it shares an NVLink with, from the inventory's link matrix:
    a GPU that names another's PCI address is bridged to it; GPUs that name one address
    that is no GPU of the node reach one NVSwitch, so each is linked to the others."""
    by_pci = {pci.lower(): uuid for uuid, pci, _ in node.gpus if pci}
    linked: dict[str, set[str]] = {uuid: set() for uuid, _, _ in node.gpus}
    switches: dict[str, set[str]] = defaultdict(set)
    for uuid, _, peers in node.gpus:
        for remote in peers:
            other = by_pci.get(remote.lower())
            if other is None:
                switches[remote.lower()].add(uuid)
            elif other != uuid:
                linked[uuid].add(other)
                linked[other].add(uuid)
    for members in switches.values():
        for uuid in members:
            linked[uuid] |= members - {uuid}
    return {uuid: frozenset(p) for uuid, p in linked.items()}


def _pairwise(atoms: Iterable[AtomRow], links: dict[str, frozenset[str]]) -> bool:
    gpus = [a for a in atoms if a.cls == "gpu"]
    return all(
        y.device_id in links.get(x.device_id, frozenset())
        for i, x in enumerate(gpus)
        for y in gpus[i + 1 :]
    )


def unlinked(view: LedgerView, ask: Ask, booked: Iterable[tuple[str, str]]) -> list[str]:
    """Right after an `nvlink-all` booking: the GPUs it took on each node (`booked`:
    (nodeId, atomId)) are pairwise NVLink-connected — a clique, not a chain."""
    if not ask.nvlink:
        return []
    per_node: dict[str, list[AtomRow]] = defaultdict(list)
    for node_id, atom_id in booked:
        atom = view.atoms.get(atom_id)
        if atom is not None:
            per_node[node_id].append(atom)
    out = []
    for node_id, atoms in sorted(per_node.items()):
        node = view.nodes.get(node_id)
        if node is not None and not _pairwise(atoms, gpu_links(node)):
            shown = sorted(a.device_id for a in atoms if a.cls == "gpu")
            out.append(f"nvlink-all booked GPUs {shown} on {node_id}: not pairwise NVLinked")
    return out


# -- one node, one window -------------------------------------------------------------------


def _matches(atom: AtomRow, e: Entry) -> bool:
    if atom.cls != e.cls:
        return False
    if e.cls == "gpu.slot" and e.sharing in ("timeslice", "mps"):
        if atom.attrs.get("sharing") not in (None, e.sharing):
            return False
    return all(
        any(atom.attrs.get(k) == v or str(atom.attrs.get(k)) == str(v) for v in allowed)
        for k, allowed in e.selector
    )


def _device_atoms(view: LedgerView, node_id: str, device: str) -> frozenset[str]:
    return frozenset(
        a.atom_id
        for a in view.atoms.values()
        if a.node_id == node_id and not a.retired and (a.device_id or a.atom_id) == device
    )


def forms_at_booking(view: LedgerView, reservation_id: str) -> BookedForms:
    """What `BookedForms` records for a reservation just booked."""
    return {
        (b.reservation_id, b.atom_id): _device_atoms(
            view, b.node_id, view.atoms[b.atom_id].device_id or b.atom_id
        )
        for b in view.bookings
        if b.reservation_id == reservation_id and b.atom_id in view.atoms and b.cls != "node"
    }


def holding_promise(b: BookingRow, view: LedgerView, forms: BookedForms) -> Promise:
    """What a booking holds for placing: `promise_of`, and a part of a device whose forms
    changed since it was booked (or whose forms at booking are unknown) holds the device."""
    p = promise_of(b, view.atoms)
    if p.part is None or p.device is None:
        return p
    then = forms.get((b.reservation_id, b.atom_id))
    if then is None or then != _device_atoms(view, b.node_id, p.device):
        return Promise(p.node, p.device, None)
    return p


def _own_promise(a: AtomRow) -> Promise:
    """What booking this current atom would promise."""
    if a.cls == "node":
        return Promise(a.node_id, None, None)
    is_part = a.cls in ("gpu.mig", "gpu.slot") or (
        a.cls == "nic.vf" and a.attrs.get("sriov") is True
    )
    return Promise(a.node_id, a.device_id or a.atom_id, a.atom_id if is_part else None)


def _in_window(start: int, end: int, lo: int, hi: int) -> bool:
    return end > start and start < hi and lo < end


def _pool_memory_free(view: LedgerView, ask: Ask) -> int:
    """Allocatable memory of the pool less every memory commitment in the window, spot
    ones included."""
    capacity = sum(
        n.scalars["memoryGiB"]
        for n in view.nodes.values()
        if n.pool_id == ask.pool_id and node_bucket(n) == "allocatable"
    )
    used = sum(
        s.amount
        for s in view.scalars
        if s.pool_id == ask.pool_id
        and s.resource == "memoryGiB"
        and _in_window(s.start, s.end, ask.start, ask.end)
    )
    return capacity - used


def _node_fits(
    view: LedgerView, node: NodeRow, ask: Ask, forms: BookedForms, ignore_spot: bool
) -> bool:
    """One node takes one member of the request with every booking in the window
    holding (with `ignore_spot`, every one but spot holders')."""
    lo, hi = ask.start, ask.end
    bookings = [
        b
        for b in view.bookings
        if b.node_id == node.node_id
        and _in_window(b.start, b.end, lo, hi)
        and not (ignore_spot and b.spot)
    ]
    scalars = [
        s
        for s in view.scalars
        if s.node_id == node.node_id
        and _in_window(s.start, s.end, lo, hi)
        and not (ignore_spot and s.spot)
    ]
    atoms = sorted(
        (a for a in view.atoms.values() if a.node_id == node.node_id and not a.retired),
        key=lambda a: a.atom_id,
    )
    if ask.whole_node:
        if bookings or scalars:
            return False
        if node.scalars["memoryGiB"] > _pool_memory_free(view, ask):
            return False
        held: list[Promise] = []
    else:
        for resource, amount in ask.resources:
            used = sum(s.amount for s in scalars if s.resource == resource)
            if node.scalars.get(resource, 0) - used < amount:
                return False
        held = [holding_promise(b, view, forms) for b in bookings]
    free = [
        a
        for a in atoms
        if a.health not in FAULTY and not any(collide(_own_promise(a), h) for h in held)
    ]
    slots = [e for e in ask.entries for _ in range(e.count)]
    links = gpu_links(node) if ask.nvlink else None
    return _assign(slots, free, [], links)


def _assign(
    slots: list[Entry],
    free: list[AtomRow],
    taken: list[AtomRow],
    links: dict[str, frozenset[str]] | None,
) -> bool:
    """Distinct free atoms for every slot, no two promising the same capacity, and (with
    `links`, an `nvlink-all` request) every GPU taken linked to every other."""
    if not slots:
        return True
    first, rest = slots[0], slots[1:]
    for a in free:
        if a in taken or not _matches(a, first):
            continue
        if any(collide(_own_promise(a), _own_promise(t)) for t in taken):
            continue
        if links is not None and not _pairwise([*taken, a], links):
            continue
        if _assign(rest, free, [*taken, a], links):
            return True
    return False


# -- the pool ------------------------------------------------------------------------------


def fits(
    view: LedgerView,
    ask: Ask,
    racks: dict[str, str],
    forms: BookedForms,
    *,
    ignore_spot: bool = False,
) -> bool | None:
    """Whether the request surely fits (None: not judged). `racks`: nodeId → its `rack`
    label, for gangs over racks. With `ignore_spot`, as if no spot booking held anything."""
    if any(e.topology is not None for e in ask.entries):
        return None
    size = max(1, ask.gang_size)
    free_memory = _pool_memory_free(view, ask)
    if any(r == "memoryGiB" and amount * size > free_memory for r, amount in ask.resources):
        return False
    members = [
        n
        for n in sorted(view.nodes.values(), key=lambda n: n.node_id)
        if n.pool_id == ask.pool_id
        and node_bucket(n) == "allocatable"
        and _node_fits(view, n, ask, forms, ignore_spot)
    ]
    if size == 1:
        return bool(members)
    groups: dict[str | None, list[NodeRow]] = defaultdict(list)
    for n in members:
        if ask.gang_key is None:
            groups[None].append(n)
        elif ask.gang_key == "rack" and n.node_id in racks:
            groups[racks[n.node_id]].append(n)
    for group in groups.values():
        if len(group) < size:
            continue
        if not ask.whole_node:
            return True
        smallest = sorted(n.scalars["memoryGiB"] for n in group)[:size]
        if sum(smallest) <= free_memory:
            return True
    return False


def verdict(
    view: LedgerView,
    ask: Ask,
    racks: dict[str, str],
    forms: BookedForms,
    now: int,
    notice_ms: int,
) -> str:
    """FITS, PREEMPTING, REFUSED or NOT_JUDGED (the module docstring)."""
    plain = fits(view, ask, racks, forms)
    if plain is None:
        return NOT_JUDGED
    if plain:
        return FITS
    if ask.spot:
        return REFUSED
    # The ledger tries the request's own window and, its start moved to when the
    # victims' notice runs out, the moved one: judge both at once.
    moved = max(ask.start, now + notice_ms)
    both = replace(ask, end=moved + (ask.end - ask.start))
    return PREEMPTING if fits(view, both, racks, forms, ignore_spot=True) else REFUSED


def interval_room(view: LedgerView, tenant_id: str, pool_id: str, start: int, end: int) -> int:
    """What one more interval reservation may surely take in [start, end): the pool's
    allocatable memory less every memory commitment overlapping it, within each quota
    of the tenant's less what the tenant has committed against it; on the 4 GB grain."""
    capacity = sum(
        n.scalars["memoryGiB"]
        for n in view.nodes.values()
        if n.pool_id == pool_id and node_bucket(n) == "allocatable"
    )
    mem = [s for s in view.scalars if s.resource == "memoryGiB"]
    room = capacity - sum(
        s.amount for s in mem if s.pool_id == pool_id and _in_window(s.start, s.end, start, end)
    )
    for q in view.quotas:
        if q.tenant_id != tenant_id or q.resource != "memoryGiB":
            continue
        if q.pool_id and q.pool_id != pool_id:
            continue
        used = sum(
            s.amount
            for s in mem
            if s.tenant_id == tenant_id
            and (not q.pool_id or s.pool_id == q.pool_id)
            and _in_window(s.start, s.end, start, end)
        )
        room = min(room, q.limit - used)
    room = max(0, room)
    return room - room % 4
