"""The reference model: what the ledger must never do, written from the SPEC (§2 rollup,
§5 placement and truth under change) independently of the coordinator's own code — its
own claim rule, peak arithmetic, buckets and reservation clock — so that a bug shared by
the ledger and its rebuild, or by the placer and the claims module, still shows.

Every check returns the violations it found as sentences (empty: none), so the state
machine can assert and the soak can count. Whether a request surely fits, so that a
refusal can be judged too, is `reference_fit` (placement on the reference's own rules).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tests.simulation.ledger_view import AtomRow, BookingRow, LedgerView, NodeRow, ScalarRow

LIVE_STATES = frozenset({"scheduled", "active", "noticed"})
RESOURCES = (
    "gpu",
    "gpu.mig",
    "gpu.slot",
    "nic.vf",
    "disk",
    "node",
    "vcpu",
    "memoryGiB",
    "hugepages1Gi",
)
SCALARS = ("vcpu", "memoryGiB", "hugepages1Gi")
BUCKETS = ("allocatable", "provisioning", "unhealthy", "maintenance", "unreachable")
FAULTY = ("unhealthy", "unmonitored")


# -- one physical device, one promise --------------------------------------------------


@dataclass(frozen=True, slots=True)
class Promise:
    """What one booking promises on its node: the whole node (device None), a whole
    device (part None) or one part of a device's current partition."""

    node: str
    device: str | None
    part: str | None


def promise_of(b: BookingRow, atoms: dict[str, AtomRow]) -> Promise:
    """SPEC §5: a whole GPU, its MIG instances and its slots are forms of one device, a
    NIC and its VFs likewise; `node` covers the node. A booking whose form is no longer
    current (re-partitioned, lost) still holds its whole device."""
    if b.cls == "node":
        return Promise(b.node_id, None, None)
    atom = atoms.get(b.atom_id)
    device = (atom.device_id if atom is not None else "") or b.atom_id
    if atom is None or atom.retired or atom.node_id != b.node_id:
        return Promise(b.node_id, device, None)
    is_part = b.cls in ("gpu.mig", "gpu.slot") or (
        b.cls == "nic.vf" and atom.attrs.get("sriov") is True
    )
    return Promise(b.node_id, device, b.atom_id if is_part else None)


def collide(x: Promise, y: Promise) -> bool:
    if x.node != y.node:
        return False
    if x.device is None or y.device is None:
        return True
    return x.device == y.device and (x.part is None or y.part is None or x.part == y.part)


def _overlap(a: BookingRow | ScalarRow, b: BookingRow | ScalarRow) -> bool:
    return a.start < b.end and b.start < a.end


def held(view: LedgerView) -> list[BookingRow]:
    return [b for b in view.bookings if b.end > b.start]


def double_bookings(view: LedgerView) -> list[str]:
    """At any time: one atom held by two reservations at once, or a whole node held
    while anything else on it is. (Fleet changes cannot excuse either.)"""
    out: list[str] = []
    by_atom: dict[str, list[BookingRow]] = defaultdict(list)
    by_node: dict[str, list[BookingRow]] = defaultdict(list)
    for b in held(view):
        by_atom[b.atom_id].append(b)
        by_node[b.node_id].append(b)
    for atom_id, rows in sorted(by_atom.items()):
        for i, x in enumerate(rows):
            for y in rows[i + 1 :]:
                if x.reservation_id != y.reservation_id and _overlap(x, y):
                    out.append(
                        f"atom {atom_id} booked twice: {x.reservation_id} [{x.start},{x.end}) "
                        f"and {y.reservation_id} [{y.start},{y.end})"
                    )
    for node_id, rows in sorted(by_node.items()):
        for x in (r for r in rows if r.cls == "node"):
            for y in rows:
                if y.reservation_id != x.reservation_id and _overlap(x, y):
                    out.append(
                        f"node {node_id} booked whole by {x.reservation_id} while "
                        f"{y.reservation_id} holds {y.atom_id}"
                    )
    return out


def broken_promises(view: LedgerView, reservation_id: str) -> list[str]:
    """Right after a reservation was booked: none of its bookings may promise physical
    capacity that another reservation's overlapping booking already promised."""
    mine = [b for b in held(view) if b.reservation_id == reservation_id]
    others = [b for b in held(view) if b.reservation_id != reservation_id]
    out = []
    for x in mine:
        px = promise_of(x, view.atoms)
        for y in others:
            if y.node_id == x.node_id and _overlap(x, y) and collide(px, promise_of(y, view.atoms)):
                out.append(
                    f"{reservation_id} booked {x.atom_id} [{x.start},{x.end}) over "
                    f"{y.reservation_id}'s {y.atom_id} [{y.start},{y.end}) (same physical device)"
                )
    return out


# -- amounts over time ------------------------------------------------------------------


def peak(
    items: Iterable[tuple[int, int, int]], lo: int | None = None, hi: int | None = None
) -> int:
    """The most held at one instant of [lo, hi) (all time when not given): the level is
    constant between starts, so looking at `lo` and every start inside is enough."""
    spans = [(s, e, n) for s, e, n in items if e > s and n]
    if not spans:
        return 0
    lo = min(s for s, _, _ in spans) if lo is None else lo
    hi = max(e for _, e, _ in spans) if hi is None else hi
    if hi <= lo:
        return 0
    instants = {lo} | {s for s, _, _ in spans if lo < s < hi}
    return max(sum(n for s, e, n in spans if s <= t < e) for t in instants)


def overcommitted(view: LedgerView, reservation_id: str, now: int) -> list[str]:
    """Right after a booking: within its window, no node's vCPU/memory and no pool's
    memory (node-level and interval bookings together) is promised beyond what is
    allocatable now."""
    out = []
    mine = [s for s in view.scalars if s.reservation_id == reservation_id and s.end > s.start]
    for s in mine:
        if s.node_id:
            node = view.nodes.get(s.node_id)
            capacity = node.scalars.get(s.resource, 0) if node is not None else 0
            same = [
                (o.start, o.end, o.amount)
                for o in view.scalars
                if o.node_id == s.node_id and o.resource == s.resource
            ]
            used = peak(same, s.start, s.end)
            if used > capacity:
                out.append(
                    f"{reservation_id}: node {s.node_id} {s.resource} promised {used} of "
                    f"{capacity} in [{s.start},{s.end})"
                )
        if s.resource == "memoryGiB":
            capacity = sum(
                n.scalars["memoryGiB"]
                for n in view.nodes.values()
                if n.pool_id == s.pool_id and node_bucket(n) == "allocatable"
            )
            pool = [
                (o.start, o.end, o.amount)
                for o in view.scalars
                if o.pool_id == s.pool_id and o.resource == "memoryGiB"
            ]
            used = peak(pool, s.start, s.end)
            if used > capacity:
                out.append(
                    f"{reservation_id}: pool {s.pool_id} memoryGiB promised {used} of "
                    f"{capacity} allocatable in [{s.start},{s.end})"
                )
    return sorted(set(out))


def quota_overruns(view: LedgerView) -> list[str]:
    """Quotas only ever go up in the simulation, so at no instant may a tenant hold more
    than any of its quotas: a tenant-wide one counts every pool, compute `memoryGiB` and
    interval reservations alike (SPEC §5, one arithmetic)."""
    out = []
    for q in view.quotas:
        if q.resource in SCALARS:
            items = [
                (s.start, s.end, s.amount)
                for s in view.scalars
                if s.tenant_id == q.tenant_id
                and s.resource == q.resource
                and (not q.pool_id or s.pool_id == q.pool_id)
            ]
        else:
            items = [
                (b.start, b.end, 1)
                for b in view.bookings
                if b.tenant_id == q.tenant_id
                and b.cls == q.resource
                and (not q.pool_id or b.pool_id == q.pool_id)
            ]
        used = peak(items)
        if used > q.limit:
            scope = q.pool_id or "every pool"
            out.append(
                f"tenant {q.tenant_id} holds {used} {q.resource} in {scope}, quota {q.limit}"
            )
    return out


# -- rollup -------------------------------------------------------------------------------


def node_bucket(n: NodeRow) -> str:
    if not n.reachable:
        return "unreachable"
    if n.maintenance:
        return "maintenance"
    if n.provisioning:
        return "provisioning"
    if n.health in FAULTY:
        return "unhealthy"
    return "allocatable"


def atom_bucket(n: NodeRow, a: AtomRow) -> str:
    bucket = node_bucket(n)
    if bucket == "allocatable" and a.health in FAULTY:
        return "unhealthy"
    return bucket


def expected_rollup(view: LedgerView, pool_id: str, now: int) -> dict[str, dict[str, int]]:
    """SPEC §2 from the rows: buckets from nodes and current atoms; `allocated` and
    `reserved` from bookings on allocatable atoms (each atom once per column), scalars'
    `reserved` the peak of future commitments."""
    rows = {r: dict.fromkeys(("total", *BUCKETS), 0) for r in RESOURCES}
    nodes = {k: n for k, n in view.nodes.items() if n.pool_id == pool_id}
    allocatable_atoms: set[str] = set()
    for a in view.atoms.values():
        node = nodes.get(a.node_id)
        if node is None or a.retired:
            continue
        bucket = atom_bucket(node, a)
        rows[a.cls][bucket] += 1
        rows[a.cls]["total"] += 1
        if bucket == "allocatable":
            allocatable_atoms.add(a.atom_id)
    for n in nodes.values():
        for r in SCALARS:
            rows[r][node_bucket(n)] += n.scalars[r]
            rows[r]["total"] += n.scalars[r]
    now_atoms: dict[str, set[str]] = defaultdict(set)
    later_atoms: dict[str, set[str]] = defaultdict(set)
    for b in held(view):
        if b.pool_id != pool_id or b.atom_id not in allocatable_atoms or b.end <= now:
            continue
        (now_atoms if b.start <= now else later_atoms)[b.cls].add(b.atom_id)
    allocatable_nodes = {k for k, n in nodes.items() if node_bucket(n) == "allocatable"}
    now_amount: dict[str, int] = defaultdict(int)
    later: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    for s in view.scalars:
        if s.pool_id != pool_id or s.end <= now or s.end <= s.start:
            continue
        if s.node_id and s.node_id not in allocatable_nodes:
            continue
        if s.start <= now:
            now_amount[s.resource] += s.amount
        else:
            later[s.resource].append((s.start, s.end, s.amount))
    out = {}
    for r, row in rows.items():
        if r in SCALARS:
            allocated, reserved = now_amount[r], peak(later[r])
        else:
            allocated, reserved = len(now_atoms[r]), len(later_atoms[r])
        out[r] = row | {
            "allocated": allocated,
            "reserved": reserved,
            "available": max(0, row["allocatable"] - allocated - reserved),
        }
    return out


def rollup_mismatches(view: LedgerView, pool_ids: Iterable[str], now: int) -> list[str]:
    """Every stored row obeys its own arithmetic and equals the reference at `now` (the
    reservation clock has refreshed every pool whose bookings started or ended)."""
    out = []
    for pool_id in sorted(pool_ids):
        want = expected_rollup(view, pool_id, now)
        for resource, expected in want.items():
            row = view.rollup.get((pool_id, resource))
            if row is None:
                out.append(f"pool {pool_id}: no rollup row for {resource}")
                continue
            if row["total"] != sum(row[b] for b in BUCKETS):
                out.append(
                    f"pool {pool_id} {resource}: total {row['total']} is not the sum "
                    f"of its buckets {[row[b] for b in BUCKETS]}"
                )
            free = max(0, row["allocatable"] - row["allocated"] - row["reserved"])
            if row["available"] != free:
                out.append(
                    f"pool {pool_id} {resource}: available {row['available']}, "
                    f"max(0, allocatable - allocated - reserved) is {free}"
                )
            wrong = {c: (row[c], v) for c, v in expected.items() if row[c] != v}
            if wrong:
                shown = ", ".join(f"{c} {got} (expected {v})" for c, (got, v) in wrong.items())
                out.append(f"pool {pool_id} {resource}: {shown}")
    return out


# -- reservations and the clock ---------------------------------------------------------


@dataclass
class ReservationModel:
    """What the simulation knows of one reservation from the answers it was given."""

    reservation_id: str
    tenant_id: str
    pool_id: str
    start: int
    end: int
    atoms: tuple[str, ...]
    lease_seconds: int | None
    lease_expires_at: int | None
    preempt_at: int | None = None
    released_at: int | None = None

    def states(self, now: int, ticks: list[int]) -> set[str]:
        """The states the reservation may show at `now`: the first of release, lease
        expiry, preemption and its end that is due decides; two that fell between the
        same two ticks of the reservation clock may be settled in either order."""
        if self.released_at is not None:
            return {"released"}
        events = [(self.end, "completed")]
        if self.lease_expires_at is not None and self.lease_expires_at < self.end:
            events.append((self.lease_expires_at, "expired"))
        if self.preempt_at is not None and self.preempt_at < self.end:
            events.append((self.preempt_at, "preempted"))
        due = sorted(e for e in events if e[0] <= now)
        if not due:
            if self.preempt_at is not None and self.preempt_at < self.end:
                return {"noticed"}
            return {"scheduled"} if now < self.start else {"active"}
        first, state = due[0]
        settled_by = min((t for t in ticks if t >= first), default=now)
        return {state} | {s for t, s in due[1:] if t <= settled_by and s != "completed"}

    def live(self, now: int, ticks: list[int]) -> bool:
        return self.states(now, ticks) <= LIVE_STATES

    def held_until(self) -> int:
        """Where its bookings end while it is live."""
        return min(self.end, self.preempt_at) if self.preempt_at is not None else self.end


def state_mismatches(
    models: Iterable[ReservationModel], shown: Mapping[str, str], now: int, ticks: list[int]
) -> list[str]:
    """Each reservation shows a state the clock allows (`shown`: id → the ledger's state
    now)."""
    out = []
    for m in models:
        state, allowed = shown.get(m.reservation_id), m.states(now, ticks)
        if state not in allowed:
            out.append(
                f"{m.reservation_id} shows {state!r} at {now}, the clock allows "
                f"{sorted(allowed)} ({m})"
            )
    return out


@dataclass(frozen=True, slots=True)
class Holding:
    """What a reservation should hold: its atoms over [start, until) while live."""

    reservation_id: str
    state: str
    start: int
    until: int
    atoms: tuple[str, ...]


def holding_mismatches(view: LedgerView, holdings: Iterable[Holding], now: int) -> list[str]:
    """A reservation's bookings say what its state says: a live one holds each of its
    atoms (and its scalars) over [start, until), an ended one holds nothing after now."""
    atoms_of: dict[str, list[BookingRow]] = defaultdict(list)
    for b in view.bookings:
        atoms_of[b.reservation_id].append(b)
    scalars_of: dict[str, list[ScalarRow]] = defaultdict(list)
    for s in view.scalars:
        scalars_of[s.reservation_id].append(s)
    out = []
    for h in holdings:
        rid = h.reservation_id
        rows: list[BookingRow | ScalarRow] = [*atoms_of[rid], *scalars_of[rid]]
        if h.state in LIVE_STATES:
            booked = sorted(b.atom_id for b in atoms_of[rid])
            if h.until > h.start and booked != sorted(h.atoms):
                out.append(f"{rid} ({h.state}) books {booked}, answered {sorted(h.atoms)}")
            wrong = sorted(
                {(r.start, r.end) for r in rows if (r.start, r.end) != (h.start, h.until)}
            )
            if wrong:
                out.append(
                    f"{rid} ({h.state}) has bookings over {wrong}, expected [{h.start},{h.until})"
                )
        else:
            late = [r.end for r in rows if r.end > now]
            if late:
                out.append(f"{rid} ({h.state}) still holds bookings until {max(late)} at {now}")
    return out


def moved_bookings(view: LedgerView, now: int) -> list[str]:
    """A pool move never carries bookings across pools: every booking still to run is in
    its node's pool, and every current atom is in its node's pool."""
    out = []
    for b in view.bookings:
        node = view.nodes.get(b.node_id)
        if b.end > now and b.end > b.start and node is not None and node.pool_id != b.pool_id:
            out.append(
                f"{b.reservation_id} holds {b.atom_id} in pool {b.pool_id}, "
                f"its node is in {node.pool_id}"
            )
    for a in view.atoms.values():
        node = view.nodes.get(a.node_id)
        if node is not None and not a.retired and a.pool_id != node.pool_id:
            out.append(f"atom {a.atom_id} in pool {a.pool_id}, its node in {node.pool_id}")
    return out


def at_risk_atoms(view: LedgerView, m: ReservationModel) -> tuple[set[str], bool]:
    """SPEC §5 "At risk": the reservation's atoms that are unreachable, in maintenance
    (pool change pending included), held in provisioning ("every hold puts bookings at
    risk alike", issue 31), no longer current (reconfigured, lost) or unhealthy (the
    device, or the node); and whether the answer is open to reading (moot: it never
    holds anything)."""
    if m.held_until() <= m.start:
        # Noticed before it starts: it will never hold anything, so whether it is at
        # risk is moot (the ledger stops judging it; the SPEC says nothing).
        return set(), True
    risky: set[str] = set()
    for atom_id in m.atoms:
        atom = view.atoms.get(atom_id)
        node = view.nodes.get(atom.node_id) if atom is not None else None
        if atom is None or node is None or atom.retired:
            risky.add(atom_id)
            continue
        # Every bucket but allocatable is a hold, and a faulty device is one of its own.
        if node_bucket(node) != "allocatable" or atom.health in FAULTY:
            risky.add(atom_id)
    return risky, False
