"""Small rules the placer and the database's claim rows rely on (SPEC §5 "One physical
device, one promise"), each pinned where mutation testing found nothing holding it: the
whole-node claim, half-open overlaps, a device's form digest, one booking's merged rows,
healthy counts, and kept free counts that fork and forget."""

from __future__ import annotations

from dataclasses import replace

from coordinator.domain.claims import (
    NODE_DEVICE,
    WHOLE,
    WHOLE_NODE,
    Claim,
    ClaimRow,
    claim_of,
    form_of,
    merged_rows,
    overlaps,
)
from coordinator.domain.free_index import FreeCounts
from coordinator.domain.placement_model import AtomSlot, HeldClaim, Holder, healthy_counts
from tests.unit.coordinator.domain.test_placer import node


def test_a_node_atom_claims_the_whole_node_whatever_its_device() -> None:
    assert claim_of("n:node", "node", "", {}) is WHOLE_NODE
    assert claim_of("n:node", "node", "n", {}) is WHOLE_NODE
    assert claim_of("n:disk:w", "disk", "", {}) == Claim("n:disk:w")


def test_windows_are_half_open() -> None:
    assert overlaps(0, 10, 9, 20)
    assert not overlaps(0, 10, 10, 20)
    assert not overlaps(10, 20, 0, 10)
    assert overlaps(5, 6, 0, 10)


def test_a_devices_form_names_its_set_of_atoms_in_any_order() -> None:
    one = form_of(["b", "a"])
    assert one == form_of(["a", "b"]) and len(one) == 32
    assert one != form_of(["a"]) and one != form_of(["a", "b", "c"])
    # Stored in every claim row: a new digest would make each live booking's form
    # look re-partitioned after an upgrade.
    assert one == "7e18f737311b2dc3b2f269dd78396b03"


def test_a_bookings_exclusive_row_stands_for_its_shared_row_of_the_same_key() -> None:
    shared = ClaimRow(NODE_DEVICE, WHOLE, False, "node")
    exclusive = ClaimRow(NODE_DEVICE, WHOLE, True, "node")
    assert merged_rows([shared, exclusive]) == [exclusive]
    assert merged_rows([exclusive, shared]) == [exclusive]
    first = ClaimRow("G0", WHOLE, True, "f1")
    assert merged_rows([first, ClaimRow("G0", WHOLE, True, "f2")]) == [first]
    assert merged_rows([ClaimRow("G1", "p", False, "f"), shared]) == [
        shared,
        ClaimRow("G1", "p", False, "f"),
    ]


def test_healthy_counts_count_healthy_atoms_per_class() -> None:
    atoms = (
        AtomSlot("a", "gpu", True, {}, "G0"),
        AtomSlot("b", "gpu", False, {}, "G1"),
        AtomSlot("c", "gpu", True, {}, "G2"),
        AtomSlot("d", "disk", True, {}),
        AtomSlot("e", "nic.vf", False, {}),
    )
    assert healthy_counts(atoms) == {"gpu": 2, "disk": 1}


def test_a_forked_index_moves_apart_and_touched_nodes_forget_their_window_counts() -> None:
    nodes = (node("a", gpus=2), node("b", gpus=2))
    held: dict[str, tuple[HeldClaim, ...]] = {}
    counts = FreeCounts(nodes, lambda n: held.get(n, ()))
    key = (frozenset({"gpu"}), False, None, None)
    index = counts.index(key, lambda n: None)
    assert index.free == {"a": 2, "b": 2} and index.order == [(2, "a"), (2, "b")]
    window = counts.counted_in(key, 0, 10)
    window["a"] = 1
    twin_held = {"a": (HeldClaim("a:gpu:0", Claim("GPU-a-0"), Holder("r", False)),)}
    twin = counts.fork(lambda n: twin_held.get(n, ()))
    assert twin.nodes() == counts.nodes()
    assert twin.counted_in(key, 0, 10) == {"a": 1}
    twin.touch(["a"])
    assert twin.index(key, lambda n: None).free == {"a": 1, "b": 2}
    assert twin.index(key, lambda n: None).order == [(1, "a"), (2, "b")]
    assert twin.counted_in(key, 0, 10) == {}
    # The original keeps its own counts and window counts.
    assert counts.index(key, lambda n: None).free == {"a": 2, "b": 2}
    assert counts.counted_in(key, 0, 10) == {"a": 1}
    counts.touch(["b"])
    assert counts.counted_in(key, 0, 10) == {"a": 1}
    counts.touch(["a"])
    assert counts.counted_in(key, 0, 10) == {}


def test_gpus_are_linked_by_the_link_matrix_else_by_a_shared_clique_label() -> None:
    def gpu(device: str, peers: frozenset[str] | None, clique: str | None) -> AtomSlot:
        attrs = {} if clique is None else {"nvlinkClique": clique}
        return AtomSlot(f"n:gpu:{device}", "gpu", True, attrs, device, peers)

    a = gpu("G0", frozenset({"G1"}), "c0")
    b = gpu("G1", frozenset({"G0"}), "c0")
    c = gpu("G2", frozenset(), "c0")
    assert a.linked(b) and b.linked(a)
    assert not a.linked(c)  # the matrix decides, whatever the labels say
    unmatrixed = gpu("G3", None, "c0")
    assert a.linked(unmatrixed) and unmatrixed.linked(a)  # one side without: labels
    assert not gpu("G4", None, "c1").linked(unmatrixed)
    assert not gpu("G5", None, None).linked(gpu("G6", None, None))
    assert not gpu("G5", None, None).linked(unmatrixed)
    # An empty label is no clique (an agent that found no NVLink): two such GPUs
    # without a matrix are not linked.
    assert gpu("G7", None, "").clique is None
    assert not gpu("G7", None, "").linked(gpu("G8", None, ""))


def test_a_loaded_nodes_healthy_count_comes_from_its_kept_counts() -> None:
    loaded = replace(node("a", gpus=2), healthy_by_class={"gpu": 5, "disk": 1})
    assert loaded.healthy({"gpu"}) == 5
    assert loaded.healthy({"gpu", "disk", "nic.vf"}) == 6
    assert node("a", gpus=2, sick=(0,)).healthy({"gpu", "node"}) == 2


def test_a_fork_keeps_the_refusals_and_touch_recounts_past_an_ineligible_node() -> None:
    down = replace(node("u", gpus=2), state=replace(node("u").state, reachable=False))
    nodes = (node("a", gpus=2), down)
    held: dict[str, tuple[HeldClaim, ...]] = {}
    counts = FreeCounts(nodes, lambda n: held.get(n, ()))
    key = (frozenset({"gpu"}), False, None, None)

    def refusal(n: object) -> str | None:
        return None if n is not down else "not allocatable: unreachable"

    assert counts.index(key, refusal).refused == {"not allocatable: unreachable": 1}
    twin = counts.fork(lambda n: held.get(n, ()))
    assert twin.index(key, refusal).refused == {"not allocatable: unreachable": 1}
    held["a"] = (HeldClaim("a:gpu:0", Claim("GPU-a-0"), Holder("r", False)),)
    twin.touch(["u", "a"])
    assert twin.index(key, refusal).free == {"a": 1}


def test_window_counts_are_kept_per_window_and_the_oldest_goes_first() -> None:
    counts = FreeCounts((node("a", gpus=2),), lambda n: ())
    key = (frozenset({"gpu"}), False, None, None)
    counts.counted_in(key, 0, 10)["a"] = 1
    assert counts.counted_in(key, 5, 10) == {}
    assert counts.counted_in(key, 0, 11) == {}
    for start in range(100, 129):  # 32 windows in all: every one kept
        counts.counted_in(key, start, start + 1)["a"] = 2
    assert counts.counted_in(key, 0, 10) == {"a": 1}
    counts.counted_in(key, 129, 130)  # the 33rd: the oldest goes
    assert counts.counted_in(key, 128, 129) == {"a": 2}
    assert counts.counted_in(key, 0, 10) == {}


def test_irregular_nodes_are_counted_in_each_windows_own_claims() -> None:
    a = node("a", gpus=2)
    counts = FreeCounts((a,), lambda n: ())
    key = (frozenset({"gpu"}), False, None, None)
    one = {"a": (HeldClaim("a:gpu:0", Claim("GPU-a-0"), Holder("r", False)),)}
    early = counts.window(frozenset({"a"}), 0, 10)
    _, few, found = early.candidates(key, lambda n: None, one, 1)
    assert (few, [(f, n) for f, n, _ in found]) == (0, [(1, "a")])
    late = counts.window(frozenset({"a"}), 5, 10)
    _, few, found = late.candidates(key, lambda n: None, {}, 1)
    assert (few, [(f, n) for f, n, _ in found]) == (0, [(2, "a")])
    later = counts.window(frozenset({"a"}), 0, 20)
    _, few, found = later.candidates(key, lambda n: None, {}, 2)
    assert (few, [(f, n) for f, n, _ in found]) == (0, [(2, "a")])


def test_a_node_with_exactly_the_free_count_needed_is_a_candidate_whatever_its_id() -> None:
    nodes = (node("A", gpus=2), node("Z", gpus=1), node("b", gpus=3))
    counts = FreeCounts(nodes, lambda n: ())
    key = (frozenset({"gpu"}), False, None, None)
    _, few, found = counts.window(frozenset(), 0, 10).candidates(key, lambda n: None, {}, 2)
    assert few == 1 and [(f, n) for f, n, _ in found] == [(2, "A"), (3, "b")]
    irregular = counts.window(frozenset({"A", "Z"}), 0, 10)
    _, few, found = irregular.candidates(key, lambda n: None, {}, 2)
    assert few == 1 and [(f, n) for f, n, _ in found] == [(2, "A"), (3, "b")]
