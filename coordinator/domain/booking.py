"""One booking decision: where a compute request goes, whom it preempts, whether the
tenant's quotas let it, and what is written for it.

The service layer's shape (cosmicpython's): the ledger loads a `Draft` under the pool
lock — the pool's bookings for any window, the tenant's quotas and what counts against
them — `decide` answers from it alone, and the ledger writes the `Decision` it returns.
The single create path and the batched one (group commit) both go through `decide`; a
batch `record`s each decision in its draft, so the next request of the batch sees it.
`preview` is the read-only question. Pure: no clock, no I/O, no randomness (the
reservation id comes with the request).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass, field
from typing import Any, Protocol

from coordinator.domain.claims import ClaimRow, claim_rows, merged_rows
from coordinator.domain.commitments import Commitment, peak
from coordinator.domain.model import Quota
from coordinator.domain.node_fit import BusyUnits
from coordinator.domain.placement_model import (
    AtomSlot,
    NodeSlot,
    Placement,
    PlacementRequest,
    PoolSnapshot,
)
from coordinator.domain.placer import place
from coordinator.domain.pool_cache import HeldAtom, HeldScalar
from coordinator.domain.reservation import LIVE, BookedAtom, Reservation
from coordinator.domain.risk import UNHEALTHY, assess
from shared.ids import new_reservation_id


@dataclass(frozen=True, slots=True)
class BookingRequest:
    tenant_id: str
    pool_id: str
    project_id: str | None
    placement: PlacementRequest
    start: int
    duration_ms: int
    lease_seconds: int | None
    resources: dict[str, int]
    gang: dict[str, Any] | None
    notice_ms: int
    # Drawn with the request, so that deciding it is a function of its inputs.
    reservation_id: str = field(default_factory=new_reservation_id)
    # GPUs in unbooked use (node, unit UUID) as the use join last saw them: taken last.
    busy: BusyUnits = frozenset()


@dataclass(frozen=True, slots=True)
class Booked:
    reservation: Reservation
    victims: tuple[Reservation, ...]
    warnings: tuple[str, ...] = ()  # GPUs in unbooked use it took (`Placement.warnings`)


@dataclass(frozen=True, slots=True)
class Preemptible:
    """A regular request that fits once spot reservations are noticed: how many would
    be, and when the request would start (after their notice)."""

    count: int
    starts_at: int


@dataclass(frozen=True, slots=True)
class NotPlaced:
    placement: Placement
    preemptible: Preemptible | None


@dataclass(frozen=True, slots=True)
class Preview:
    """Where a request would go now, and (a regular request that does not fit) what
    preempting spot reservations would give it."""

    placement: Placement
    preemptible: Preemptible | None

    @property
    def warnings(self) -> tuple[str, ...]:
        return self.placement.warnings if self.placement.fits else ()


@dataclass(frozen=True, slots=True)
class Deferred:
    """Not decided in a batch; the request must run alone."""

    reason: str


PREEMPTS = "it would preempt spot reservations"
LOCKED_OUT = "another writer holds the tenant's quota lock"


@dataclass(frozen=True, slots=True)
class OverQuota:
    """The quota verdict against: `requested` more on top of `used` (at the window's
    busiest instant) passes `quota`."""

    quota: Quota
    used: int
    requested: int


@dataclass(frozen=True, slots=True)
class Decision:
    """A booking decided: the reservation, the placement it books (the best node
    alone, or a gang's members), the spot reservations it notices (at `preempt_at`), its
    bookings and claim rows, and what it adds to the rollup's booked columns
    (`recount_all`: victims were cut short, recount instead)."""

    reservation: Reservation
    placement: Placement
    victims: tuple[str, ...]
    preempt_at: int | None
    atoms: tuple[HeldAtom, ...]
    scalars: tuple[HeldScalar, ...]
    claims: Mapping[str, list[ClaimRow]]  # nodeId → claim rows
    allocated: Mapping[str, int]
    reserved: Mapping[str, int]
    recount: frozenset[str]  # scalar resources whose booked columns are recounted

    @property
    def recount_all(self) -> bool:
        return bool(self.victims)


class PoolWindows(Protocol):
    """The pool's nodes and bookings, seen for any window."""

    def snapshot(self, start: int, end: int) -> PoolSnapshot: ...

    def node(self, node_id: str) -> NodeSlot: ...


@dataclass(slots=True)
class Draft:
    """What bookings of one pool are decided against, loaded under the pool lock."""

    pool_id: str
    now: int
    pool: PoolWindows
    # Atoms that already count as `reserved` (a booking of theirs starts after now),
    # read from `pool`: a batch adds each decision it records to the pool it drafts on.
    reserved: Set[str]
    # Tenant → its quotas that count bookings in this pool, by resource, the pool's own
    # before the tenant-wide one.
    quotas: Mapping[str, list[Quota]]
    # (tenant, resource, quota's pool or None) → the tenant's bookings from now on.
    committed: Mapping[tuple[str, str, str | None], list[Commitment]]
    # Tenants whose tenant-wide quota lock another writer holds.
    locked_out: Set[str] = frozenset()
    # What the draft's earlier decisions took: (tenant, resource) → commitments.
    pending: dict[tuple[str, str], list[Commitment]] = field(default_factory=dict)

    def record(self, decision: Decision) -> None:
        """A decision is being written with this draft: later ones count it against
        the quotas (its bookings themselves are added to the pool by whoever drafts on
        it, `SnapshotDraft.add`)."""
        res = decision.reservation
        if res.tenant_id not in self.quotas:
            return  # nothing counts it: `quota_verdict` reads `pending` for quotas only
        for h in decision.atoms:
            self.pending.setdefault((res.tenant_id, h.cls), []).append(
                Commitment(h.start, h.end, 1)
            )
        for sc in decision.scalars:
            self.pending.setdefault((res.tenant_id, sc.resource), []).append(
                Commitment(sc.start, sc.end, sc.amount)
            )


Outcome = Decision | NotPlaced | OverQuota | Deferred


def decide(draft: Draft, r: BookingRequest, *, may_preempt: bool = True) -> Outcome:
    """Decide `r` against `draft`. A regular request that fits only by preempting spot
    reservations is `Deferred` unless `may_preempt` (a batch leaves it to run alone)."""
    now = draft.now
    start, end = r.start, r.start + r.duration_ms
    snap = draft.pool.snapshot(start, end)
    # A booking takes the best node (every member of a gang): the placer stops at the
    # first node that fits, which is the best, as it tries them in packing order.
    placement = place(r.placement, snap, limit=1, busy=r.busy)
    victims: frozenset[str] = frozenset()
    preempt_at: int | None = None
    if not placement.fits:
        if r.placement.spot:
            return NotPlaced(placement, None)
        if not may_preempt:
            if _best(r.placement, snap, ignore_spot=True).fits:
                return Deferred(PREEMPTS)
            return NotPlaced(placement, None)
        plan = preempting(draft.pool, r.placement, start, r.duration_ms, now, r.notice_ms, r.busy)
        if plan is None or not plan[0].fits:
            return NotPlaced(placement, None)
        placement, victims, start = plan
        end, preempt_at = start + r.duration_ms, now + r.notice_ms
    verdict = quota_verdict(draft, r.tenant_id, asked_of(placement), start, end)
    if verdict is not None:
        return verdict
    reservation = reservation_of(r, placement, start, end, now)
    atoms, scalars = held_of(reservation, placement, draft.pool)
    claims = {p.node_id: rows_for(draft.pool.node(p.node_id), p.atoms) for p in placement.chosen}
    unhealthy = {a.atom_id for p in placement.chosen for a in p.atoms if not a.healthy}
    allocated, reserved = booked_delta(atoms, draft.reserved, unhealthy, now)
    return Decision(
        reservation=reservation,
        placement=placement,
        victims=tuple(sorted(victims)),
        preempt_at=preempt_at,
        atoms=tuple(atoms),
        scalars=tuple(scalars),
        claims=claims,
        allocated=allocated,
        reserved=reserved,
        recount=frozenset(sc.resource for sc in scalars),
    )


def preview(
    pool: PoolWindows,
    req: PlacementRequest,
    start: int,
    end: int,
    now: int,
    notice_ms: int,
    busy: BusyUnits = frozenset(),
) -> Preview:
    """Where `req` would go over `[start, end)`, and what preempting would give it;
    GPUs in unbooked use (`busy`) go last."""
    placement = place(req, pool.snapshot(start, end), busy=busy)
    if placement.fits or req.spot:
        return Preview(placement, None)
    plan = preempting(pool, req, start, end - start, now, notice_ms, busy)
    if plan is None or not plan[0].fits:
        return Preview(placement, None)
    _, victims, moved_start = plan
    return Preview(placement, Preemptible(len(victims), moved_start))


def preempting(
    pool: PoolWindows,
    req: PlacementRequest,
    start: int,
    duration_ms: int,
    now: int,
    notice_ms: int,
    busy: BusyUnits = frozenset(),
) -> tuple[Placement, frozenset[str], int] | None:
    """For a regular request that does not fit: where it would go if it started at
    preemptAt and the spot reservations still holding what it takes were noticed.
    None when even preempting every spot booking would not make room."""
    if not _best(req, pool.snapshot(start, start + duration_ms), ignore_spot=True).fits:
        return None
    moved_start = max(start, now + notice_ms)
    snap = pool.snapshot(moved_start, moved_start + duration_ms)
    # Spot reservations that end before preemptAt need no notice.
    placement = _best(req, snap, busy=busy)
    if placement.fits:
        return placement, frozenset(), moved_start
    placement = _best(req, snap, ignore_spot=True, busy=busy)
    victims = frozenset().union(*(pick.victims for pick in placement.chosen))
    return placement, victims, moved_start


def _best(
    req: PlacementRequest,
    snap: PoolSnapshot,
    *,
    ignore_spot: bool = False,
    busy: BusyUnits = frozenset(),
) -> Placement:
    """What a booking takes of `snap` (or only whether `req` fits there): the best node
    alone (every member of a gang), as the placer stops at the first node that fits, which
    is the best, as it tries them in packing order; a placement that does not fit is not
    explained, as only a booking's first placement (`decide`) is ever shown."""
    return place(req, snap, ignore_spot=ignore_spot, limit=1, explain=False, busy=busy)


def quota_verdict(
    draft: Draft, tenant_id: str, asked: Mapping[str, int], start: int, end: int
) -> OverQuota | Deferred | None:
    """The first quota `asked` over `[start, end)` would pass, at the busiest instant
    of the window, counting what the draft decided before; None when all hold."""
    tenant_quotas = draft.quotas.get(tenant_id)
    if not tenant_quotas:
        return None
    wanted = {resource: n for resource, n in asked.items() if n > 0}
    for quota in tenant_quotas:
        if quota.resource not in wanted:
            continue
        if quota.pool_id is None and tenant_id in draft.locked_out:
            return Deferred(LOCKED_OUT)
        committed = draft.committed.get((tenant_id, quota.resource, quota.pool_id), [])
        # Every booking of the draft is in its pool: it counts in both scopes.
        pending = draft.pending.get((tenant_id, quota.resource), [])
        held = [c for c in (*committed, *pending) if c.start < end and c.end > start]
        used = peak(held, start, end)
        if used + wanted[quota.resource] > quota.limit:
            return OverQuota(quota, used, wanted[quota.resource])
    return None


def booked_delta(
    atoms: Iterable[HeldAtom], already_reserved: Set[str], not_allocatable: Set[str], now: int
) -> tuple[dict[str, int], dict[str, int]]:
    """What new atom bookings add to `allocated` (booked now) and `reserved` (starting
    later, each atom once however many later bookings it has). Atoms outside the
    allocatable bucket (a whole node's faulty devices) count in neither. Scalars are
    recounted instead: their `reserved` is a peak, not a sum."""
    allocated: dict[str, int] = {}
    reserved: dict[str, int] = {}
    for h in atoms:
        if h.atom_id in not_allocatable:
            continue
        if h.start <= now < h.end:
            allocated[h.cls] = allocated.get(h.cls, 0) + 1
        elif h.start > now and h.atom_id not in already_reserved:
            reserved[h.cls] = reserved.get(h.cls, 0) + 1
    return allocated, reserved


def reservation_of(
    r: BookingRequest, placement: Placement, start: int, end: int, now: int
) -> Reservation:
    """The reservation a fitting placement of `r` books over `[start, end)`."""
    # Only whole nodes are booked with their faulty devices: such a reservation is at
    # risk from its first answer, not from whichever node change re-judges it.
    unhealthy = {a.atom_id for p in placement.chosen for a in p.atoms if not a.healthy}
    return Reservation(
        reservation_id=r.reservation_id,
        tenant_id=r.tenant_id,
        pool_id=r.pool_id,
        project_id=r.project_id,
        stored_state=LIVE,
        spot=r.placement.spot,
        binding=r.placement.binding,
        start=start,
        end=end,
        lease_seconds=r.lease_seconds,
        lease_expires_at=now + r.lease_seconds * 1000 if r.lease_seconds else None,
        preempt_at=None,
        resources=r.resources,
        gang=r.gang,
        atoms=tuple(
            BookedAtom(a.atom_id, pick.node_id, a.cls)
            for pick in placement.chosen
            for a in pick.atoms
        ),
        created_at=now,
        at_risk=assess(dict.fromkeys(unhealthy, UNHEALTHY), None, now),
    )


def asked_of(placement: Placement) -> dict[str, int]:
    """What a placement takes per atom class and scalar resource, for the quota check."""
    asked: dict[str, int] = {}
    for pick in placement.chosen:
        for a in pick.atoms:
            asked[a.cls] = asked.get(a.cls, 0) + 1
        for resource, amount in pick.resources:
            asked[resource] = asked.get(resource, 0) + amount
    return asked


def held_of(
    res: Reservation, placement: Placement, pool: PoolWindows
) -> tuple[list[HeldAtom], list[HeldScalar]]:
    """The new reservation's bookings as the snapshot cache holds them: each atom pinned
    to its device and that device's partition now (`PoolCache.pinned`, which then has
    nothing left to do), made once rather than made and pinned."""
    rid, spot, start, end = res.reservation_id, res.spot, res.start, res.end
    atoms: list[HeldAtom] = []
    for pick in placement.chosen:
        node = pool.node(pick.node_id)
        for a in pick.atoms:
            form = node.form(a.device_id) if a.device_id else ""
            atoms.append(
                HeldAtom(a.atom_id, pick.node_id, a.cls, rid, spot, start, end, a.device_id, form)
            )
    scalars = [
        HeldScalar(pick.node_id, resource, amount, res.reservation_id, res.spot, res.start, res.end)
        for pick in placement.chosen
        for resource, amount in pick.resources
        if amount > 0
    ]
    return atoms, scalars


def rows_for(node: NodeSlot, atoms: Iterable[AtomSlot]) -> list[ClaimRow]:
    """The claim rows of booking `atoms` (current atoms of `node`)."""
    rows: list[ClaimRow] = []
    for atom in atoms:
        claim = atom.claim
        rows.extend(claim_rows(claim, node.form(claim.device or "")))
    return merged_rows(rows)
