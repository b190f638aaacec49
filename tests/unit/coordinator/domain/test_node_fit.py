"""Device selection on one node (`node_fit`), by what the placer takes: sharing modes,
NVLink cliques against every maximal clique of the link matrix, which atoms go first
(unlinked, then small cliques, one clique at a time), selectors within one clique, and
which spot holders a pick notices for its devices and for its scalars."""

from __future__ import annotations

from dataclasses import replace
from itertools import combinations

from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.domain.claims import WHOLE_NODE, Claim
from coordinator.domain.node_fit import free_among
from coordinator.domain.placement_model import (
    AtomSlot,
    DeviceRequest,
    Holder,
    PlacementRequest,
    PoolSnapshot,
)
from coordinator.domain.placer import place
from tests.unit.coordinator.domain.test_placer_truth import (
    ask,
    hold,
    host,
    linked_node,
    migs,
    slots,
    taken,
    whole,
)


def _spot(snap: PoolSnapshot, holds: dict[str, set[str]]) -> PoolSnapshot:
    """Spot bookings on node n: GPU index → the spot reservations holding it."""
    held = tuple(
        hold(f"n:gpu:{i}", Claim(f"GPU-n-{i}"), rid, spot=True)
        for i, rids in holds.items()
        for rid in sorted(rids)
    )
    return replace(snap, held={"n": held})


def _picked(snap: PoolSnapshot, req: PlacementRequest) -> tuple[list[str], frozenset[str]]:
    result = place(req, snap, ignore_spot=True)
    assert result.fits
    return sorted(a.atom_id for a in result.candidates[0].atoms), result.victims


# --- sharing -------------------------------------------------------------------------


def test_a_sharing_mode_takes_only_slots_of_that_mode() -> None:
    mps = [replace(a, attrs={"sharing": "mps"}) for a in slots("n", 1, 1)]
    snap = PoolSnapshot((host("n", [*slots("n", 0, 2), *mps]),))
    time_slice = DeviceRequest("gpu.slot", 2, sharing="timeslice")
    assert taken(snap, PlacementRequest(devices=(time_slice,))) == {
        "n:gpu.slot:0:0",
        "n:gpu.slot:0:1",
    }
    assert taken(snap, PlacementRequest(devices=(replace(time_slice, count=3),))) == set()
    only_mps = PlacementRequest(devices=(DeviceRequest("gpu.slot", 1, sharing="mps"),))
    assert taken(snap, only_mps) == {"n:gpu.slot:1:0"}
    two_mps = PlacementRequest(devices=(DeviceRequest("gpu.slot", 2, sharing="mps"),))
    assert taken(snap, two_mps) == set()
    assert len(taken(snap, ask("gpu.slot", 3))) == 3  # no mode asked: any slot


# --- selectors -----------------------------------------------------------------------


def test_a_selector_matches_a_number_and_its_string_either_way() -> None:
    atoms = [
        whole("n", 0, memoryMiB=81920, cc="9.0", model="H100"),
        whole("n", 1, memoryMiB=40960, cc="8.0", model="A100"),
    ]
    snap = PoolSnapshot((host("n", atoms),))

    def select(*selector: tuple[str, tuple[str | int | float, ...]]) -> set[str]:
        return taken(snap, PlacementRequest(devices=(DeviceRequest("gpu", 1, selector),)))

    assert select(("memoryMiB", ("81920",))) == {"n:gpu:0"}
    assert select(("cc", (8.0,))) == {"n:gpu:1"}
    assert select(("model", ("B200", "A100"))) == {"n:gpu:1"}
    assert select(("model", ("H100",)), ("cc", (8.0,))) == set()
    assert select(("rack", ("r1",))) == set()


# --- NVLink cliques from the matrix --------------------------------------------------


@st.composite
def link_matrices(draw: st.DrawFn) -> dict[int, set[int]]:
    n = draw(st.integers(2, 6))
    pairs = list(combinations(range(n), 2))
    edges = draw(st.sets(st.sampled_from(pairs)))
    return {i: {j for e in edges if i in e for j in e if j != i} for i in range(n)}


def _maximal_cliques(peers: dict[int, set[int]]) -> list[list[int]]:
    """Every maximal set of pairwise linked GPUs, by brute force."""
    cliques = [
        list(s)
        for k in range(1, len(peers) + 1)
        for s in combinations(sorted(peers), k)
        if all(b in peers[a] for a, b in combinations(s, 2))
    ]
    return [c for c in cliques if not any(set(c) < set(d) for d in cliques)]


@settings(max_examples=200, deadline=None)
@given(peers=link_matrices(), data=st.data())
def test_nvlink_takes_the_smallest_maximal_clique_that_holds_it_noticing_fewest_spot(
    peers: dict[int, set[int]], data: st.DataObject
) -> None:
    """Against every maximal clique by brute force: the clique that preempts the fewest
    spot holders (one per held GPU), the smallest and lowest of equals, its free GPUs
    first, lowest first."""
    count = data.draw(st.integers(2, len(peers)))
    held = data.draw(st.sets(st.sampled_from(sorted(peers))))
    snap = _spot(PoolSnapshot((linked_node("n", peers),)), {i: {f"s{i}"} for i in held})
    cliques = sorted(_maximal_cliques(peers), key=lambda c: (len(c), c))
    ways = [
        [i for i in c if i not in held] + [i for i in c if i in held]
        for c in cliques
        if len(c) >= count
    ]
    result = place(ask("gpu", count, topology="nvlink-all"), snap, ignore_spot=True)
    if ways:
        best = min(ways, key=lambda w: len(set(w[:count]) & held))[:count]
        assert result.fits
        assert sorted(a.atom_id for a in result.candidates[0].atoms) == sorted(
            f"n:gpu:{i}" for i in best
        )
        assert result.victims == {f"s{i}" for i in best if i in held}
    else:
        assert not result.fits
        assert result.shortfalls[0].available == max(len(c) for c in cliques)


def test_an_entry_marked_any_stays_out_of_the_request_wide_clique() -> None:
    snap = PoolSnapshot((linked_node("n", {0: {1}, 1: {0}, 2: {3}, 3: {2}}),))
    req = PlacementRequest(
        devices=(DeviceRequest("gpu", 2), DeviceRequest("gpu", 2, topology="any")),
        topology="nvlink-all",
    )
    assert len(taken(snap, req)) == 4
    together = replace(req, devices=(req.devices[0], replace(req.devices[1], topology=None)))
    assert taken(snap, together) == set()


def test_an_entry_of_its_own_two_nvlink_gpus_takes_a_linked_pair() -> None:
    crossed = PoolSnapshot((linked_node("n", {0: {2}, 1: {3}, 2: {0}, 3: {1}}),))
    entry = PlacementRequest(devices=(DeviceRequest("gpu", 2, topology="nvlink-all"),))
    assert taken(crossed, entry) == {"n:gpu:0", "n:gpu:2"}


def test_selectors_in_one_clique_skip_a_clique_that_cannot_hold_them_all() -> None:
    # Two cliques of three: 0-1-2 all model A, 3-4-5 two A and a B.
    models = "AAAAAB"
    atoms = [
        replace(
            whole("n", i, model=models[i]),
            peers=frozenset(f"GPU-n-{j}" for j in range(6) if j != i and j // 3 == i // 3),
        )
        for i in range(6)
    ]
    snap = PoolSnapshot((host("n", atoms),))
    req = PlacementRequest(
        devices=(
            DeviceRequest("gpu", 1, (("model", ("B",)),)),
            DeviceRequest("gpu", 2, (("model", ("A",)),)),
        ),
        topology="nvlink-all",
    )
    assert taken(snap, req) == {"n:gpu:3", "n:gpu:4", "n:gpu:5"}
    over = replace(req, devices=(replace(req.devices[0], count=2), req.devices[1]))
    assert taken(snap, over) == set()


# --- which atoms go first ------------------------------------------------------------


def test_unlinked_gpus_go_first_then_the_smallest_clique_whatever_its_name() -> None:
    labelled = [whole("n", i, nvlinkClique="a" if i < 4 else "z") for i in range(6)]
    snap = PoolSnapshot((host("n", labelled),))
    assert taken(snap, ask("gpu", 1)) == {"n:gpu:4"}
    unlinked = [whole("n", i) for i in range(3)] + [whole("n", 3, nvlinkClique="solo")]
    assert taken(PoolSnapshot((host("n", unlinked),)), ask("gpu", 1)) == {"n:gpu:0"}


def test_one_clique_is_used_up_before_the_next_of_the_same_size() -> None:
    atoms = [whole("n", i, nvlinkClique="ab"[i % 2]) for i in range(4)]
    assert taken(PoolSnapshot((host("n", atoms),)), ask("gpu", 2)) == {"n:gpu:0", "n:gpu:2"}


def test_two_atoms_that_claim_one_device_whole_are_never_both_taken() -> None:
    # A NIC without SR-IOV is booked whole, whichever of its atoms is asked for.
    nic = [
        AtomSlot(f"n:nic.vf:{k}", "nic.vf", True, {"sriov": False}, "0000:40:00.0")
        for k in range(2)
    ]
    other = AtomSlot("n:nic.vf:9", "nic.vf", True, {"sriov": False}, "0000:41:00.0")
    snap = PoolSnapshot((host("n", [*nic, other]),))
    assert taken(snap, ask("nic.vf", 2)) == {"n:nic.vf:0", "n:nic.vf:9"}
    assert taken(snap, ask("nic.vf", 3)) == set()


# --- the spot holders a pick notices -------------------------------------------------


def test_each_gpu_taken_adds_the_fewest_spot_holders_not_yet_noticed() -> None:
    snap = PoolSnapshot((host("n", [whole("n", i) for i in range(4)]),))
    snap = _spot(snap, {0: {"s1"}, 1: {"s2"}, 2: {"s3"}, 3: {"s1", "s2"}})
    # GPU 0 (s1), GPU 1 (s2, as new as any), then GPU 3: s1 and s2 are noticed already.
    assert _picked(snap, ask("gpu", 3)) == (
        ["n:gpu:0", "n:gpu:1", "n:gpu:3"],
        frozenset({"s1", "s2"}),
    )


def test_an_nvlink_pick_takes_the_clique_that_notices_fewest_first_of_equals() -> None:
    pairs = {0: {1}, 1: {0}, 2: {3}, 3: {2}}
    snap = PoolSnapshot((linked_node("n", pairs),))
    pair = ask("gpu", 2, topology="nvlink-all")
    one_held = _spot(snap, {0: {"s1"}})
    assert _picked(one_held, pair) == (["n:gpu:2", "n:gpu:3"], frozenset())
    both_held = _spot(snap, {0: {"s1"}, 2: {"s2"}})
    assert _picked(both_held, pair) == (["n:gpu:0", "n:gpu:1"], frozenset({"s1"}))
    # The one free linked pair is found wherever it sits: a chain 0-1-2, a ring 0-1-3-2.
    chain = PoolSnapshot((linked_node("n", {0: {1}, 1: {0, 2}, 2: {1}}),))
    assert _picked(_spot(chain, {0: {"s1"}}), pair) == (["n:gpu:1", "n:gpu:2"], frozenset())
    ring = PoolSnapshot((linked_node("n", {0: {1, 2}, 1: {0, 3}, 2: {0, 3}, 3: {1, 2}}),))
    ring_held = _spot(ring, {0: {"s1"}, 2: {"s2"}})
    assert _picked(ring_held, pair) == (["n:gpu:1", "n:gpu:3"], frozenset())


def _scalars(*held: tuple[int, str, bool]) -> PoolSnapshot:
    holders = tuple((amount, Holder(rid, spot)) for amount, rid, spot in held)
    return PoolSnapshot((host("n", [whole("n", 0)]),), scalar_holders={"n": {"vcpu": holders}})


def _vcpu(amount: int, *more: tuple[str, int]) -> PlacementRequest:
    return replace(ask("gpu", 1), resources=(("vcpu", amount), *more))


def test_scalars_fit_up_to_the_last_unit_and_no_further() -> None:
    assert place(_vcpu(128), _scalars()).fits
    assert not place(_vcpu(129), _scalars()).fits
    full = place(_vcpu(1), _scalars((128, "r", False)))
    assert not full.fits and full.filtered == {"too little free vcpu": 1}
    # A resource asked as 0 needs nothing, and the next one is still checked.
    zero_first = place(_vcpu(0, ("memoryGiB", 2000)), _scalars())
    assert zero_first.filtered == {"too little free memoryGiB": 1}


def test_every_booking_of_a_scalar_counts_a_holder_with_two_counts_twice() -> None:
    assert not place(_vcpu(1), _scalars((64, "r1", False), (64, "r2", False))).fits
    # s1 holds 60 in two bookings: it alone frees the 52 missing, s2's 40 would not.
    two = _scalars((30, "s1", True), (40, "s2", True), (30, "s1", True))
    assert _picked(two, _vcpu(80))[1] == {"s1"}


def test_scalar_victims_are_the_largest_spot_holders_then_by_id_and_no_more() -> None:
    small_and_big = _scalars((10, "s-a", True), (100, "s-b", True))
    assert _picked(small_and_big, _vcpu(100))[1] == {"s-b"}
    equal = _scalars((64, "s-z", True), (64, "s-a", True))
    assert _picked(equal, _vcpu(64))[1] == {"s-a"}
    # 101 of 128 with every vCPU held: the 100 holder leaves one missing.
    last_unit = _scalars((100, "s-big", True), (28, "s-small", True))
    assert _picked(last_unit, _vcpu(101))[1] == {"s-big", "s-small"}
    assert _picked(last_unit, _vcpu(100))[1] == {"s-big"}


# --- free counts ---------------------------------------------------------------------


def test_free_counts_take_every_hold_spot_ones_only_when_not_ignored() -> None:
    node = host("n", [whole("n", 0), whole("n", 1), *migs("n", 2, 2)])
    regular = hold("n:gpu:1", Claim("GPU-n-1"), "r")
    spot = hold("n:gpu:0", Claim("GPU-n-0"), "s", spot=True)
    assert free_among(node, (regular,), {"gpu"}, False) == 1
    assert free_among(node, (spot, regular), {"gpu"}, False) == 0
    assert free_among(node, (spot, regular), {"gpu"}, True) == 1
    # A MIG instance booked takes itself, not its sibling, whatever their order.
    second = hold("n:gpu.mig:2.1", migs("n", 2, 2)[1].claim, "r")
    assert free_among(node, (second,), {"gpu.mig"}, False) == 1
    # A booking of the whole node leaves nothing free.
    assert free_among(node, (hold("n:node", WHOLE_NODE, "r"),), {"gpu", "gpu.mig"}, False) == 0
