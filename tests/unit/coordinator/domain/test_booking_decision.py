"""`decide` as a pure function: one booking's placement, preemption, quota verdict, rows
and rollup delta, from a draft built in memory (no database)."""

from __future__ import annotations

from collections import defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.domain.booking import (
    LOCKED_OUT,
    PREEMPTS,
    BookingRequest,
    Decision,
    Deferred,
    Draft,
    NotPlaced,
    OverQuota,
    decide,
    preview,
)
from coordinator.domain.commitments import Commitment, peak
from coordinator.domain.model import NodeState, Quota
from coordinator.domain.placement_model import AtomSlot, DeviceRequest, NodeSlot, PlacementRequest
from coordinator.domain.pool_cache import HeldAtom, PoolCache, SnapshotDraft

NOW = 1_700_000_000_000
HOUR = 3_600_000
READY = NodeState(reachable=True, health="healthy", maintenance=False, provisioning=False)


def node(node_id: str, gpus: int = 4) -> NodeSlot:
    atoms = tuple(
        AtomSlot(f"{node_id}:gpu:{i}", "gpu", True, {"index": i}, f"GPU-{node_id}-{i}")
        for i in range(gpus)
    )
    return NodeSlot(
        node_id, READY, {}, "std", 1, atoms, {"vcpu": 64, "memoryGiB": 512, "hugepages1Gi": 0}
    )


def pool(*nodes: NodeSlot) -> SnapshotDraft:
    cache = PoolCache(nodes_version=1, bookings_version=1, nodes=nodes)
    cache.current = {a.atom_id: (n.node_id, a) for n in nodes for a in n.atoms}
    cache.by_id = {n.node_id: n for n in nodes}
    cache.capacity_memory = sum(n.capacity["memoryGiB"] for n in nodes)
    return SnapshotDraft(cache)


def draft(
    view: SnapshotDraft,
    quotas: list[Quota] = (),  # type: ignore[assignment]
    committed: dict[tuple[str, str, str | None], list[Commitment]] | None = None,
    locked_out: frozenset[str] = frozenset(),
) -> Draft:
    by_tenant: dict[str, list[Quota]] = defaultdict(list)
    for q in sorted(quotas, key=lambda q: (q.resource, q.pool_id is None)):
        by_tenant[q.tenant_id].append(q)
    return Draft(
        "pool-1", NOW, view, view.reserved_atoms(NOW), by_tenant, committed or {}, locked_out
    )


def request(
    count: int, start: int = NOW, hours: int = 1, spot: bool = False, rid: str = "rsv-1",
    tenant: str = "acme",
) -> BookingRequest:  # fmt: skip
    return BookingRequest(
        tenant_id=tenant, pool_id="pool-1", project_id=None,
        placement=PlacementRequest(devices=(DeviceRequest("gpu", count),), spot=spot),
        start=start, duration_ms=hours * HOUR, lease_seconds=None, resources={}, gang=None,
        notice_ms=120_000, reservation_id=rid,
    )  # fmt: skip


def booked(view: SnapshotDraft, d: Draft, decision: Decision) -> None:
    """What a batch does with a decision it writes."""
    d.record(decision)
    view.add(list(decision.atoms), list(decision.scalars))


def test_a_fitting_request_is_decided_with_its_rows_and_rollup_delta() -> None:
    view = pool(node("n0"), node("n1"))
    out = decide(draft(view), request(2))
    assert isinstance(out, Decision)
    res = out.reservation
    assert res.reservation_id == "rsv-1" and (res.start, res.end) == (NOW, NOW + HOUR)
    assert [a.node_id for a in res.atoms] == ["n0", "n0"]
    assert [h.atom_id for h in out.atoms] == [a.atom_id for a in res.atoms]
    assert set(out.claims) == {"n0"}
    exclusive = {row.device for row in out.claims["n0"] if row.exclusive}
    assert exclusive == {"GPU-n0-0", "GPU-n0-1"}
    assert (dict(out.allocated), dict(out.reserved)) == ({"gpu": 2}, {})
    assert out.victims == () and out.preempt_at is None and not out.recount_all


def test_a_later_booking_counts_as_reserved_once_per_atom() -> None:
    view = pool(node("n0", gpus=1))
    d = draft(view)
    first = decide(d, request(1, start=NOW + HOUR))
    assert isinstance(first, Decision) and dict(first.reserved) == {"gpu": 1}
    booked(view, d, first)
    second = decide(d, request(1, start=NOW + 3 * HOUR, rid="rsv-2"))
    assert isinstance(second, Decision)
    assert dict(second.reserved) == {} and dict(second.allocated) == {}


def test_deciding_changes_nothing_until_the_decision_is_recorded() -> None:
    view = pool(node("n0", gpus=2))
    d = draft(view)
    first = decide(d, request(2))
    assert decide(d, request(2)) == first
    booked(view, d, first)  # type: ignore[arg-type]
    out = decide(d, request(1, rid="rsv-2"))
    assert isinstance(out, NotPlaced) and out.preemptible is None
    assert not out.placement.fits


def test_a_quota_verdict_counts_what_the_draft_decided_before() -> None:
    view = pool(node("n0"), node("n1"))
    quota = Quota("acme", "pool-1", "gpu", 3)
    held = {("acme", "gpu", "pool-1"): [Commitment(NOW - HOUR, NOW + HOUR, 1)]}
    d = draft(view, [quota], held)
    first = decide(d, request(2))
    assert isinstance(first, Decision)
    booked(view, d, first)
    out = decide(d, request(1, rid="rsv-2"))
    assert out == OverQuota(quota, 3, 1)
    # After the window the earlier bookings end, so the quota has room again.
    assert isinstance(decide(d, request(1, start=NOW + HOUR, rid="rsv-3")), Decision)
    # Another tenant is not counted against acme's quota.
    assert isinstance(decide(d, request(1, rid="rsv-4", tenant="other")), Decision)


def test_a_tenant_wide_quota_whose_lock_another_writer_holds_defers() -> None:
    view = pool(node("n0"))
    d = draft(view, [Quota("acme", None, "gpu", 10)], locked_out=frozenset({"acme"}))
    assert decide(d, request(1)) == Deferred(LOCKED_OUT)


def test_a_regular_request_preempts_spot_holders_after_their_notice() -> None:
    view = pool(node("n0", gpus=2))
    d = draft(view)
    spot = decide(d, request(2, hours=4, spot=True, rid="spot-1"))
    assert isinstance(spot, Decision)
    booked(view, d, spot)
    assert isinstance(decide(d, request(1, spot=True, rid="spot-2")), NotPlaced)
    assert decide(d, request(1, rid="rsv-2"), may_preempt=False) == Deferred(PREEMPTS)
    out = decide(d, request(1, rid="rsv-2"))
    assert isinstance(out, Decision)
    assert out.victims == ("spot-1",) and out.preempt_at == NOW + 120_000
    assert out.reservation.start == NOW + 120_000 and out.recount_all
    seen = preview(view, request(1).placement, NOW, NOW + HOUR, NOW, 120_000)
    assert not seen.placement.fits
    assert seen.preemptible is not None and seen.preemptible.count == 1


requests = st.lists(
    st.tuples(
        st.integers(1, 4),  # gpus
        st.integers(0, 5),  # start, hours from now
        st.integers(1, 3),  # hours
        st.sampled_from(["acme", "beta"]),
    ),
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(requests)
def test_decisions_in_one_draft_never_share_an_atom_or_pass_a_quota(
    asked: list[tuple[int, int, int, str]],
) -> None:
    view = pool(node("n0"), node("n1"), node("n2", gpus=8))
    quota = Quota("acme", "pool-1", "gpu", 6)
    d = draft(view, [quota])
    taken: list[HeldAtom] = []
    for k, (count, at, hours, tenant) in enumerate(asked):
        out = decide(d, request(count, NOW + at * HOUR, hours, rid=f"r{k}", tenant=tenant))
        assert isinstance(out, Decision | NotPlaced | OverQuota)
        if isinstance(out, Decision):
            booked(view, d, out)
            taken += out.atoms
    for i, a in enumerate(taken):
        for b in taken[i + 1 :]:
            assert not (a.atom_id == b.atom_id and a.start < b.end and b.start < a.end)
    acme = [Commitment(h.start, h.end, 1) for h in taken if _of(h, asked)]
    assert peak(acme, NOW, NOW + 10 * HOUR) <= quota.limit


def _of(h: HeldAtom, asked: list[tuple[int, int, int, str]]) -> bool:
    return asked[int(h.reservation_id[1:])][3] == "acme"
