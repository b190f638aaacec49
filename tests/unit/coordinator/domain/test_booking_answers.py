"""What a booking decision and a preview answer carry besides where a request goes
(issue 31's mutation run): the reservation as the request describes it, the scalar
bookings and claim rows written for it, the rollup delta, the quota verdict's scope,
the explanation of a refusal, preemption with GPUs in unbooked use, and the device and
partition a decided booking holds in the cache."""

from __future__ import annotations

from dataclasses import replace

from coordinator.domain.booking import (
    LOCKED_OUT,
    BookingRequest,
    Decision,
    Deferred,
    Draft,
    NotPlaced,
    OverQuota,
    booked_delta,
    decide,
    preview,
)
from coordinator.domain.claims import NODE_DEVICE, form_of
from coordinator.domain.commitments import Commitment
from coordinator.domain.model import Quota
from coordinator.domain.placement_model import AtomSlot, DeviceRequest, NodeSlot, PlacementRequest
from coordinator.domain.pool_cache import HeldAtom, HeldScalar
from coordinator.domain.reservation import LIVE, BookedAtom, Reservation
from coordinator.domain.risk import UNHEALTHY, AtRisk
from tests.unit.coordinator.domain.test_booking_decision import (
    HOUR,
    NOW,
    READY,
    booked,
    draft,
    node,
    pool,
    request,
)

NOTICE = 120_000


def ask(
    gpus: int = 1, *, start: int = NOW, hours: int = 1, rid: str = "rsv-1",
    resources: tuple[tuple[str, int], ...] = (), binding: str = "hold", gang_size: int = 1,
    busy: frozenset[tuple[str, str]] = frozenset(), lease: int | None = None,
) -> BookingRequest:  # fmt: skip
    placement = PlacementRequest(
        devices=(DeviceRequest("gpu", gpus),), binding=binding,  # type: ignore[arg-type]
        resources=resources, gang_size=gang_size,
    )  # fmt: skip
    return BookingRequest(
        tenant_id="acme", pool_id="pool-1", project_id="prj-1", placement=placement,
        start=start, duration_ms=hours * HOUR, lease_seconds=lease,
        resources={"gpu": gpus, **dict(resources)}, gang={"size": gang_size},
        notice_ms=NOTICE, reservation_id=rid, busy=busy,
    )  # fmt: skip


def hold(atom_id: str, rid: str, end: int, *, spot: bool = True, start: int = NOW) -> HeldAtom:
    return HeldAtom(atom_id, atom_id.split(":")[0], "gpu", rid, spot, start, end)


def test_a_decision_books_the_reservation_the_request_describes() -> None:
    view = pool(node("n0"))
    r = ask(start=NOW + HOUR, hours=2, resources=(("vcpu", 8), ("memoryGiB", 0)), lease=600)
    out = decide(draft(view), r)
    assert isinstance(out, Decision)
    start, end = NOW + HOUR, NOW + 3 * HOUR
    assert out.reservation == Reservation(
        reservation_id="rsv-1", tenant_id="acme", pool_id="pool-1", project_id="prj-1",
        stored_state=LIVE, spot=False, binding="hold", start=start, end=end,
        lease_seconds=600, lease_expires_at=NOW + 600_000, preempt_at=None,
        resources={"gpu": 1, "vcpu": 8, "memoryGiB": 0}, gang={"size": 1},
        atoms=(BookedAtom("n0:gpu:0", "n0", "gpu"),), created_at=NOW, at_risk=None,
    )  # fmt: skip
    # The scalars it holds (none of what it asked 0 of), recounted in the rollup.
    assert out.scalars == (HeldScalar("n0", "vcpu", 8, "rsv-1", False, start, end),)
    assert out.recount == {"vcpu"}
    assert out.placement.fits and [p.node_id for p in out.placement.chosen] == ["n0"]


def test_claim_rows_name_the_device_s_current_partition() -> None:
    """A repartitioned device conflicts with bookings of its old form: each GPU's rows
    carry the form of the device's atoms as the node has them now."""
    view = pool(node("n0", gpus=2))
    out = decide(draft(view), ask(2))
    assert isinstance(out, Decision)
    forms = {row.device: row.form for row in out.claims["n0"] if row.device != NODE_DEVICE}
    assert forms == {f"GPU-n0-{i}": form_of([f"n0:gpu:{i}"]) for i in range(2)}


def faulty_node() -> NodeSlot:
    """Two GPUs, the first faulty; 1 vCPU, no hugepages."""
    atoms = tuple(
        AtomSlot(f"n0:gpu:{i}", "gpu", i != 0, {"index": i}, f"GPU-n0-{i}") for i in range(2)
    )
    return NodeSlot(
        "n0", READY, {}, "std", 1, atoms, {"vcpu": 1, "memoryGiB": 512, "hugepages1Gi": 0}
    )


def test_a_whole_node_booking_holds_what_the_node_has_and_is_at_risk_for_its_faults() -> None:
    """A whole node is booked with its faulty GPU: the reservation is at risk from its
    first answer, the faulty GPU counts in no rollup column, and it holds each scalar
    the node has (none it has 0 of). A quota the tenant is over on a resource the
    booking takes none of does not stop it."""
    view = pool(faulty_node())
    over = Quota("acme", "pool-1", "hugepages1Gi", 1)
    held = {("acme", "hugepages1Gi", "pool-1"): [Commitment(NOW - HOUR, NOW + 9 * HOUR, 2)]}
    out = decide(draft(view, [over], held), ask(binding="node"))
    assert isinstance(out, Decision)
    assert out.reservation.at_risk == AtRisk(UNHEALTHY, NOW, ("n0:gpu:0",))
    assert {a.atom_id for a in out.reservation.atoms} == {"n0:gpu:0", "n0:gpu:1"}
    assert (dict(out.allocated), dict(out.reserved)) == ({"gpu": 1}, {})
    assert sorted((s.resource, s.amount) for s in out.scalars) == [("memoryGiB", 512), ("vcpu", 1)]


def test_a_rollup_delta_counts_each_later_atom_and_nothing_that_has_ended() -> None:
    atoms = [
        HeldAtom("n0:gpu:0", "n0", "gpu", "r", False, NOW - HOUR, NOW),  # ended at now
        HeldAtom("n0:gpu:1", "n0", "gpu", "r", False, NOW + HOUR, NOW + 2 * HOUR),
        HeldAtom("n0:gpu:2", "n0", "gpu", "r", False, NOW + HOUR, NOW + 2 * HOUR),
        HeldAtom("n0:gpu:3", "n0", "gpu", "r", False, NOW - 1, NOW + 1),
    ]
    assert booked_delta(atoms, frozenset(), frozenset(), NOW) == ({"gpu": 1}, {"gpu": 2})


def test_a_scalar_quota_counts_every_gang_member_and_the_draft_s_earlier_scalars() -> None:
    view = pool(node("n0"), node("n1"), node("n2"))
    quota = Quota("acme", "pool-1", "vcpu", 20)
    held = {("acme", "vcpu", "pool-1"): [Commitment(NOW - HOUR, NOW + HOUR, 4)]}
    d = draft(view, [quota], held)
    assert decide(d, ask(resources=(("vcpu", 9),), gang_size=2)) == OverQuota(quota, 4, 18)
    first = decide(d, ask(resources=(("vcpu", 8),)))
    assert isinstance(first, Decision)
    booked(view, d, first)
    assert decide(d, ask(resources=(("vcpu", 9),), rid="rsv-2")) == OverQuota(quota, 12, 9)


def test_a_quota_binds_only_the_resources_it_names_and_the_lock_only_tenant_wide_ones() -> None:
    view = pool(node("n0"))
    # The tenant's quotas in any order: one on a resource not asked is passed over.
    quotas = {"acme": [Quota("acme", "pool-1", "vcpu", 1), Quota("acme", "pool-1", "gpu", 1)]}
    d = Draft("pool-1", NOW, view, frozenset(), quotas, {})
    assert decide(d, ask(2)) == OverQuota(quotas["acme"][1], 0, 2)
    # A tenant-wide quota with room books; another writer's lock on it defers.
    wide = [Quota("acme", None, "gpu", 4)]
    assert isinstance(decide(draft(view, wide), ask(2)), Decision)
    assert decide(draft(view, wide, locked_out=frozenset({"acme"})), ask(2)) == Deferred(LOCKED_OUT)
    # The lock is on tenant-wide quotas only: the pool's own does not wait for it.
    own = [Quota("acme", "pool-1", "gpu", 4)]
    assert isinstance(decide(draft(view, own, locked_out=frozenset({"acme"})), ask(2)), Decision)


def test_a_refusal_carries_the_placer_s_explanation() -> None:
    view = pool(node("n0", gpus=1))
    view.add([hold("n0:gpu:0", "rsv-0", NOW + 4 * HOUR, spot=False)], [])
    d = draft(view)
    for out in (decide(d, ask()), decide(d, ask(), may_preempt=False)):
        assert isinstance(out, NotPlaced) and out.preemptible is None
        assert not out.placement.fits and out.placement.reason
    spot = decide(d, request(1, spot=True))
    assert isinstance(spot, NotPlaced) and spot.placement.reason
    seen = preview(view, ask().placement, NOW, NOW + HOUR, NOW, NOTICE)
    assert seen.preemptible is None and not seen.placement.fits and seen.placement.reason


def test_a_request_a_regular_booking_blocks_now_is_refused_not_moved_past_the_notice() -> None:
    """The regular booking ends before the notice would: waiting for it is not
    preemption, so the request is refused as asked, not booked later."""
    view = pool(node("n0", gpus=1))
    view.add([hold("n0:gpu:0", "rsv-0", NOW + 60_000, spot=False)], [])
    assert isinstance(decide(draft(view), ask()), NotPlaced)
    assert preview(view, ask().placement, NOW, NOW + HOUR, NOW, NOTICE).preemptible is None


def test_a_preview_answers_what_preempting_gives_and_nothing_for_a_fit_or_a_spot() -> None:
    view = pool(node("n0", gpus=1))
    assert preview(view, ask().placement, NOW, NOW + HOUR, NOW, NOTICE).preemptible is None
    view.add([hold("n0:gpu:0", "spot-1", NOW + 4 * HOUR)], [])
    # A regular booking after the window does not matter.
    view.add([hold("n0:gpu:0", "rsv-9", NOW + 6 * HOUR, spot=False, start=NOW + 5 * HOUR)], [])
    spot = request(1, spot=True).placement
    assert preview(view, spot, NOW, NOW + HOUR, NOW, NOTICE).preemptible is None
    seen = preview(view, ask().placement, NOW, NOW + HOUR, NOW, NOTICE)
    assert seen.preemptible is not None
    assert (seen.preemptible.count, seen.preemptible.starts_at) == (1, NOW + NOTICE)
    out = decide(draft(view), ask())
    assert isinstance(out, Decision) and out.victims == ("spot-1",)
    assert (out.reservation.start, out.reservation.end) == (NOW + NOTICE, NOW + NOTICE + HOUR)


def test_after_the_notice_a_gpu_in_unbooked_use_is_taken_last() -> None:
    """Spot bookings on both nodes end before the notice: the request starts after it
    with no victim, on the node whose GPU runs no unbooked process."""
    view = pool(node("n0", gpus=1), node("n1", gpus=1))
    view.add([hold("n0:gpu:0", "s0", NOW + 60_000), hold("n1:gpu:0", "s1", NOW + 60_000)], [])
    busy = frozenset({("n0", "GPU-n0-0")})
    out = decide(draft(view), ask(busy=busy))
    assert isinstance(out, Decision) and out.victims == ()
    assert out.reservation.start == NOW + NOTICE
    assert [a.node_id for a in out.reservation.atoms] == ["n1"]


def test_preempting_prefers_more_victims_to_a_gpu_in_unbooked_use() -> None:
    """n0 has one free GPU, in unbooked use, and one spot booking; n1 two spot bookings.
    Preempting takes n1 (two victims) over the busy GPU, and preview says so too."""
    view = pool(node("n0", gpus=2), node("n1", gpus=2))
    end = NOW + 4 * HOUR
    spots = [hold("n0:gpu:1", "s1", end), hold("n1:gpu:0", "s2", end), hold("n1:gpu:1", "s3", end)]
    view.add(spots, [])
    busy = frozenset({("n0", "GPU-n0-0")})
    out = decide(draft(view), ask(2, busy=busy))
    assert isinstance(out, Decision) and out.victims == ("s2", "s3")
    seen = preview(view, ask(2).placement, NOW, NOW + HOUR, NOW, NOTICE, busy)
    assert seen.preemptible is not None and seen.preemptible.count == 2


def test_a_booking_takes_an_idle_gpu_before_one_in_unbooked_use_and_says_when_it_cannot() -> None:
    view = pool(node("n0", gpus=1), node("n1", gpus=1))
    busy = frozenset({("n0", "GPU-n0-0")})
    d = draft(view)
    first = decide(d, ask(busy=busy))
    assert isinstance(first, Decision) and first.placement.warnings == ()
    assert [a.node_id for a in first.reservation.atoms] == ["n1"]
    booked(view, d, first)
    second = decide(d, ask(busy=busy, rid="rsv-2"))
    assert isinstance(second, Decision)
    assert [a.node_id for a in second.reservation.atoms] == ["n0"]
    assert len(second.placement.warnings) == 1 and "n0:gpu:0" in second.placement.warnings[0]


def sliced(slots: int) -> NodeSlot:
    """n0 with one GPU, time-sliced into `slots` slots (slot k's atom id is the same
    whatever the number of slots: it outlives a repartition)."""
    atoms = tuple(
        AtomSlot(f"n0:gpu.slot:0:{k}", "gpu.slot", True, {"sharing": "timeslice"}, "GPU-n0-0")
        for k in range(slots)
    )
    return NodeSlot("n0", READY, {}, "std", 1, atoms, {"vcpu": 64, "memoryGiB": 512})


def ask_slot(rid: str, cls: str = "gpu.slot", start: int = NOW) -> BookingRequest:
    placement = PlacementRequest(devices=(DeviceRequest(cls, 1),))
    return BookingRequest(
        tenant_id="acme", pool_id="pool-1", project_id=None, placement=placement,
        start=start, duration_ms=HOUR, lease_seconds=None, resources={cls: 1},
        gang=None, notice_ms=NOTICE, reservation_id=rid,
    )  # fmt: skip


def test_the_other_slot_of_a_gpu_stays_bookable_beside_a_slot_booked_in_the_batch() -> None:
    view = pool(sliced(2))
    d = draft(view)
    first = decide(d, ask_slot("rsv-1"))
    assert isinstance(first, Decision)
    booked(view, d, first)
    second = decide(d, ask_slot("rsv-2"))
    assert isinstance(second, Decision)
    taken = {a.atom_id for out in (first, second) for a in out.reservation.atoms}
    assert taken == {"n0:gpu.slot:0:0", "n0:gpu.slot:0:1"}


def test_a_booking_made_here_claims_its_whole_gpu_once_the_gpu_is_repartitioned() -> None:
    """Slot 0 of 2 is booked and kept in the cache; the GPU is then sliced in 4 (slot 0
    keeps its atom id) and the nodes reloaded. The booking holds capacity of the old
    partition, which the new one does not say: it claims the whole GPU until it ends,
    as its claim rows do in the database. Likewise once its atom is gone altogether."""
    for after in (sliced(4), node("n0", gpus=1)):
        view = pool(sliced(2))
        d = draft(view)
        out = decide(d, ask_slot("rsv-1"))
        assert isinstance(out, Decision)
        booked(view, d, out)
        cache = view.cache
        cache.nodes = (after,)
        cache.current = {a.atom_id: ("n0", a) for a in after.atoms}
        cache.by_id = {"n0": after}
        cache.reset()  # what a reload of the nodes does (`SnapshotCache._fresh`)
        cls = after.atoms[0].cls
        assert isinstance(decide(draft(view), ask_slot("rsv-2", cls)), NotPlaced), cls
        later = ask_slot("rsv-2", cls, start=NOW + HOUR)
        assert isinstance(decide(draft(view), later), Decision), cls


def test_a_booking_on_a_replaced_gpu_does_not_hold_the_gpu_now_at_its_index() -> None:
    """n0's GPU 0 is booked, then replaced: the atom `n0:gpu:0` now names another
    GPU. The booking claims the GPU it was made on, which the node no longer has; the
    new GPU is bookable over the same hour."""
    view = pool(node("n0", gpus=1))
    d = draft(view)
    out = decide(d, ask(1))
    assert isinstance(out, Decision)
    booked(view, d, out)
    new = AtomSlot("n0:gpu:0", "gpu", True, {"index": 0}, "GPU-new")
    after = replace(node("n0", gpus=1), atoms=(new,))
    cache = view.cache
    cache.nodes, cache.current, cache.by_id = (after,), {new.atom_id: ("n0", new)}, {"n0": after}
    cache.reset()
    again = decide(draft(view), ask(1, rid="rsv-2"))
    assert isinstance(again, Decision)
    assert [a.atom_id for a in again.reservation.atoms] == ["n0:gpu:0"]


def test_a_decision_s_placement_names_only_the_node_it_books() -> None:
    """Two nodes fit alike: the decision's placement is what is booked, the first node in
    packing order alone, whether the request fits as asked, after the notice once the spot
    bookings on both nodes end, or by preempting them."""
    for spot_end in (None, NOW + 60_000, NOW + 4 * HOUR):
        view = pool(node("n0", gpus=1), node("n1", gpus=1))
        if spot_end is not None:
            view.add([hold("n0:gpu:0", "s0", spot_end), hold("n1:gpu:0", "s1", spot_end)], [])
        out = decide(draft(view), ask())
        assert isinstance(out, Decision), spot_end
        assert [p.node_id for p in out.placement.candidates] == ["n0"], spot_end
        assert out.victims == (("s0",) if spot_end == NOW + 4 * HOUR else ()), spot_end
