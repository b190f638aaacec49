"""The placer over hand-built fleets."""

from __future__ import annotations

from dataclasses import replace

from coordinator.domain.model import NodeState
from coordinator.domain.placement_model import (
    AtomSlot,
    DeviceRequest,
    HeldClaim,
    Holder,
    NodeSlot,
    PlacementRequest,
    PoolSnapshot,
)
from coordinator.domain.placer import place

READY = NodeState(reachable=True, health="healthy", maintenance=False, provisioning=False)


def node(
    node_id: str,
    gpus: int = 8,
    cliques: int = 1,
    rack: str = "r1",
    model: str = "H100",
    state: NodeState = READY,
    sick: tuple[int, ...] = (),
    memory: int = 1024,
) -> NodeSlot:
    per = max(1, gpus // cliques)
    atoms = [AtomSlot(f"{node_id}:node", "node", True, {})]
    for i in range(gpus):
        attrs = {"model": model, "index": i, "nvlinkClique": f"{node_id}-c{i // per}"}
        atoms.append(
            AtomSlot(f"{node_id}:gpu:{i}", "gpu", i not in sick, attrs, f"GPU-{node_id}-{i}")
        )
    return NodeSlot(
        node_id, state, {"rack": rack}, "std", 1, tuple(atoms),
        {"vcpu": 128, "memoryGiB": memory, "hugepages1Gi": 0},
    )  # fmt: skip


def gpus(count: int, **kw: object) -> PlacementRequest:
    return PlacementRequest(devices=(DeviceRequest("gpu", count),), **kw)  # type: ignore[arg-type]


def book(snap: PoolSnapshot, atom_ids: list[str], rid: str, spot: bool = False) -> PoolSnapshot:
    """Hold current atoms: each booking claims what its atom is."""
    held = {k: list(v) for k, v in snap.held.items()}
    where = {a.atom_id: (n.node_id, a) for n in snap.nodes for a in n.atoms}
    for atom_id in atom_ids:
        node_id, atom = where[atom_id]
        held.setdefault(node_id, []).append(HeldClaim(atom_id, atom.claim, Holder(rid, spot)))
    return replace(snap, held={k: tuple(v) for k, v in held.items()})


def test_a_stream_of_one_gpu_requests_packs_and_keeps_nvlink_nodes_whole() -> None:
    snap = PoolSnapshot(tuple(node(f"n{i}") for i in range(4)))
    for k in range(8):
        result = place(gpus(1), snap)
        assert result.fits
        pick = result.candidates[0]
        snap = book(snap, [a.atom_id for a in pick.atoms], f"r{k}")
    used = {node_id for node_id, claims in snap.held.items() if claims}
    assert used == {"n0"}  # one node filled, three left whole
    whole = place(gpus(8, topology="nvlink-all"), snap)
    assert whole.fits and whole.candidates[0].node_id == "n1"
    assert [c.node_id for c in whole.candidates] == ["n1", "n2", "n3"]


def test_packing_prefers_the_partly_used_node_and_ties_break_on_node_id() -> None:
    snap = PoolSnapshot((node("b"), node("a"), node("c")))
    first = place(gpus(2), snap)
    assert [c.node_id for c in first.candidates] == ["a", "b", "c"]
    snap = book(snap, ["c:gpu:0", "c:gpu:1", "c:gpu:2"], "x")
    assert place(gpus(2), snap).candidates[0].node_id == "c"


def test_nvlink_all_takes_gpus_from_one_clique_and_says_when_it_cannot() -> None:
    snap = PoolSnapshot((node("pcie", gpus=8, cliques=4),))
    ok = place(gpus(2, topology="nvlink-all"), snap)
    assert ok.fits
    assert len({a.attrs["nvlinkClique"] for a in ok.candidates[0].atoms}) == 1
    too_big = place(gpus(4, topology="nvlink-all"), snap)
    assert not too_big.fits
    short = too_big.shortfalls[0]
    assert (short.requested, short.available) == (4, 2)
    assert "NVLink" in short.reason
    assert place(gpus(4), snap).fits  # without the topology it fits


def test_any_topology_spends_small_cliques_before_breaking_big_ones() -> None:
    mixed = node("m", gpus=6, cliques=1)
    atoms = list(mixed.atoms)
    atoms[5] = replace(atoms[5], attrs={**atoms[5].attrs, "nvlinkClique": "lonely"})
    snap = PoolSnapshot((replace(mixed, atoms=tuple(atoms)),))
    pick = place(gpus(1), snap).candidates[0]
    assert pick.atoms[0].attrs["nvlinkClique"] == "lonely"


def test_selectors_node_states_and_device_health_filter_nodes() -> None:
    down = NodeState(reachable=False, health="healthy", maintenance=False, provisioning=False)
    snap = PoolSnapshot(
        (
            node("a100", model="A100"),
            node("h100", model="H100", sick=(0, 1, 2, 3, 4, 5)),
            node("gone", model="H100", state=down),
        )
    )
    want = PlacementRequest(devices=(DeviceRequest("gpu", 2, selector=(("model", ("H100",)),)),))
    result = place(want, snap)
    assert [c.node_id for c in result.candidates] == ["h100"]
    assert {a.atom_id for a in result.candidates[0].atoms} == {"h100:gpu:6", "h100:gpu:7"}
    three = replace(want, devices=(replace(want.devices[0], count=3),))
    failed = place(three, snap)
    assert not failed.fits and failed.shortfalls[0].available == 2


def test_gang_lands_in_one_rack_or_names_the_best_racks_shortfall() -> None:
    nodes = [node(f"a{i}", rack="r1") for i in range(2)] + [
        node(f"b{i}", rack="r2") for i in range(3)
    ]
    snap = PoolSnapshot(tuple(nodes))
    gang = gpus(8, gang_size=3, gang_key="rack")
    result = place(gang, snap)
    assert result.fits and [c.node_id for c in result.candidates] == ["b0", "b1", "b2"]
    failed = place(gpus(8, gang_size=4, gang_key="rack"), snap)
    assert not failed.fits
    assert failed.reason == "needs 4 nodes in one rack, best rack r2 has 3"


def test_node_binding_takes_whole_free_nodes_only() -> None:
    snap = book(PoolSnapshot((node("a"), node("b", gpus=4))), ["a:gpu:3"], "x")
    result = place(gpus(1, binding="node"), snap)
    assert [c.node_id for c in result.candidates] == ["b"]
    taken = {a.atom_id for a in result.candidates[0].atoms}
    assert "b:node" in taken and len(taken) == 5
    assert dict(result.candidates[0].resources)["memoryGiB"] == 1024


def test_scalar_resources_must_fit_on_the_same_node() -> None:
    snap = PoolSnapshot((node("small", memory=64), node("big", memory=512)))
    req = replace(gpus(1), resources=(("memoryGiB", 256),))
    assert [c.node_id for c in place(req, snap).candidates] == ["big"]
    req = replace(gpus(1), resources=(("memoryGiB", 1024),))
    failed = place(req, snap)
    assert not failed.fits and "memoryGiB" in failed.shortfalls[0].reason


def test_a_regular_request_that_only_fits_by_preempting_spot_names_its_victims() -> None:
    snap = PoolSnapshot((node("a", gpus=2),))
    snap = book(snap, ["a:gpu:0"], "spot-1", spot=True)
    snap = book(snap, ["a:gpu:1"], "spot-2", spot=True)
    assert not place(gpus(2), snap).fits
    again = place(gpus(2), snap, ignore_spot=True)
    assert again.fits and again.victims == {"spot-1", "spot-2"}
    one = place(gpus(1), snap, ignore_spot=True)
    assert len(one.victims) == 1


def test_a_refusal_with_spot_ignored_counts_spot_held_gpus_as_free() -> None:
    """What a refusal says a node has free, when spot holders may be preempted, includes
    the GPUs they hold: the most free node and the one counted out after it alike."""
    snap = PoolSnapshot((node("a", gpus=2), node("b", gpus=1)))
    snap = book(snap, ["a:gpu:0", "b:gpu:0"], "spot-1", spot=True)
    for devices in [(DeviceRequest("gpu", 3),), (DeviceRequest("gpu", 3), DeviceRequest("gpu", 1))]:
        refused = place(PlacementRequest(devices=devices), snap, ignore_spot=True)
        assert not refused.fits
        assert refused.shortfalls[0].available == 2
        assert sum(refused.filtered.values()) == 2
    blind = place(gpus(3), snap)
    assert blind.shortfalls[0].available == 1


def test_an_entry_for_any_gpu_leaves_the_one_a_later_entry_selects() -> None:
    """One H100 and one A100 on a node; asked for one GPU of any model and one H100, in
    that order: the first entry must not take the only H100 (entries are matched to
    atoms together, as a clique's are, when taking them one after another fails)."""
    base = node("a", gpus=2)
    atoms = list(base.atoms)
    for i, model in ((1, "H100"), (2, "A100")):
        atoms[i] = replace(atoms[i], attrs={**atoms[i].attrs, "model": model})
    snap = PoolSnapshot((replace(base, atoms=tuple(atoms)),))
    h100 = DeviceRequest("gpu", 1, selector=(("model", ("H100",)),))
    for devices in [(DeviceRequest("gpu", 1), h100), (h100, DeviceRequest("gpu", 1))]:
        result = place(PlacementRequest(devices=devices), snap)
        assert result.fits, result.reason
        assert {a.atom_id for a in result.chosen[0].atoms} == {"a:gpu:0", "a:gpu:1"}
    # Two H100s asked of a node with one is still refused, and says which entry is short.
    refused = place(PlacementRequest(devices=(DeviceRequest("gpu", 1), h100, h100)), snap)
    assert not refused.fits


def _models(n: NodeSlot, *models: str) -> NodeSlot:
    gpus_of = [a for a in n.atoms if a.cls == "gpu"]
    named = {
        a.atom_id: replace(a, attrs={**a.attrs, "model": m})
        for a, m in zip(gpus_of, models, strict=True)
    }
    return replace(n, atoms=tuple(named.get(a.atom_id, a) for a in n.atoms))


def test_entries_matched_together_keep_counts_cliques_and_what_a_clique_took() -> None:
    h100 = (("model", ("H100",)),)
    # Two of any model, then two H100s, of two H100s and two A100s.
    snap = PoolSnapshot((_models(node("a", gpus=4), "H100", "H100", "A100", "A100"),))
    two = (DeviceRequest("gpu", 2), DeviceRequest("gpu", 2, selector=h100))
    assert len(place(PlacementRequest(devices=two), snap).chosen[0].atoms) == 4
    # An entry asking for an NVLink clique of one GPU is any one GPU.
    snap = PoolSnapshot((_models(node("b", gpus=2), "H100", "A100"),))
    one = (DeviceRequest("gpu", 1, topology="nvlink-all"), DeviceRequest("gpu", 1, selector=h100))
    assert place(PlacementRequest(devices=one), snap).fits
    # The request's clique took both H100s of one clique; of the other clique (an H100
    # and an A100) the rest must leave the H100 to the entry that names it, and never
    # take again what the clique took.
    snap = PoolSnapshot((_models(node("c", gpus=4, cliques=2), "H100", "H100", "H100", "A100"),))
    req = PlacementRequest(
        devices=(
            DeviceRequest("gpu", 2, selector=h100),
            DeviceRequest("gpu", 1, topology="any"),
            DeviceRequest("gpu", 1, selector=h100, topology="any"),
        ),
        topology="nvlink-all",
    )
    result = place(req, snap)
    assert result.fits, result.reason
    atoms = [a.atom_id for a in result.chosen[0].atoms]
    assert sorted(atoms) == ["c:gpu:0", "c:gpu:1", "c:gpu:2", "c:gpu:3"]


def test_node_profile_filter() -> None:
    snap = PoolSnapshot((node("a"),))
    assert place(replace(gpus(1), profile_id="std", profile_version=1), snap).fits
    failed = place(replace(gpus(1), profile_id="other"), snap)
    assert not failed.fits and "profile other" in (failed.reason or "")


def test_a_whole_node_is_refused_while_anything_holds_even_a_faulty_gpu() -> None:
    snap = PoolSnapshot((node("a", gpus=4, sick=(3,)),))
    snap_held = book(snap, ["a:gpu:3"], "other")
    assert not place(gpus(1, binding="node"), snap_held).fits
    whole = place(gpus(1, binding="node"), snap)
    # It takes every atom, the faulty one too, so nobody gets it if it recovers.
    assert "a:gpu:3" in {a.atom_id for a in whole.candidates[0].atoms}


def test_a_whole_node_needs_the_pools_uncommitted_memory() -> None:
    snap = replace(PoolSnapshot((node("a", memory=1024),)), pool_free={"memoryGiB": 512})
    failed = place(gpus(1, binding="node"), snap)
    assert not failed.fits


def test_two_one_gpu_entries_under_nvlink_all_share_one_clique() -> None:
    """Request-wide `nvlink-all` binds every GPU entry together, one GPU each included:
    with one free GPU left in each clique the request fits nowhere, and with a clique
    free both come from it."""
    two = PlacementRequest(
        devices=(DeviceRequest("gpu", 1), DeviceRequest("gpu", 1)), topology="nvlink-all"
    )
    snap = book(PoolSnapshot((node("a", gpus=4, cliques=2),)), ["a:gpu:1", "a:gpu:2"], "r")
    assert not place(two, snap).fits
    picked = place(two, book(PoolSnapshot((node("a", gpus=4, cliques=2),)), ["a:gpu:1"], "r"))
    assert {a.attrs["nvlinkClique"] for a in picked.candidates[0].atoms} == {"a-c1"}
