"""The placer keeps one promise per physical device, takes NVLink cliques that are
cliques, notices only the spot holders it needs, and says why from what it filtered."""

from __future__ import annotations

from dataclasses import replace

from coordinator.domain.claims import WHOLE_NODE, Claim, conflicts, stale_claim
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
from shared.cliques import peer_sets

READY = NodeState(reachable=True, health="healthy", maintenance=False, provisioning=False)
CAPACITY = {"vcpu": 128, "memoryGiB": 1024, "hugepages1Gi": 0}


def host(node_id: str, atoms: list[AtomSlot], **kw: object) -> NodeSlot:
    return NodeSlot(
        node_id, kw.get("state", READY), {"rack": "r1"}, kw.get("profile", "std"), 1,  # type: ignore[arg-type]
        (AtomSlot(f"{node_id}:node", "node", True, {}), *atoms), dict(CAPACITY),
    )  # fmt: skip


def whole(node_id: str, i: int, **attrs: object) -> AtomSlot:
    return AtomSlot(f"{node_id}:gpu:{i}", "gpu", True, dict(attrs), f"GPU-{node_id}-{i}")


def migs(node_id: str, i: int, parts: int) -> list[AtomSlot]:
    device = f"GPU-{node_id}-{i}"
    return [
        AtomSlot(f"{node_id}:gpu.mig:{i}.{k}", "gpu.mig", True, {"profile": "1g"}, device)
        for k in range(parts)
    ]


def slots(node_id: str, i: int, replicas: int) -> list[AtomSlot]:
    device, attrs = f"GPU-{node_id}-{i}", {"sharing": "timeslice"}
    return [
        AtomSlot(f"{node_id}:gpu.slot:{i}:{k}", "gpu.slot", True, dict(attrs), device)
        for k in range(replicas)
    ]


def hold(atom_id: str, claim: Claim, rid: str, spot: bool = False) -> HeldClaim:
    return HeldClaim(atom_id, claim, Holder(rid, spot))


def ask(cls: str, count: int, **kw: object) -> PlacementRequest:
    return PlacementRequest(devices=(DeviceRequest(cls, count),), **kw)  # type: ignore[arg-type]


def taken(snap: PoolSnapshot, req: PlacementRequest, **kw: bool) -> set[str]:
    result = place(req, snap, **kw)
    return {a.atom_id for p in result.chosen for a in p.atoms} if result.fits else set()


# --- one physical device, one promise ------------------------------------------------


def test_the_conflict_rule() -> None:
    gpu, mig_a, mig_b = Claim("G"), Claim("G", "a"), Claim("G", "b")
    assert conflicts(gpu, mig_a) and conflicts(mig_a, gpu) and conflicts(gpu, gpu)
    assert conflicts(mig_a, mig_a) and not conflicts(mig_a, mig_b)
    assert not conflicts(gpu, Claim("H")) and not conflicts(mig_a, Claim("H", "a"))
    assert conflicts(WHOLE_NODE, mig_b) and conflicts(Claim("nic", "vf3"), WHOLE_NODE)
    # A form that no longer exists claims its whole device.
    assert stale_claim("n:gpu.slot:G:3", "gpu.slot", "G") == Claim("G")
    assert stale_claim("n:node", "node", "") == WHOLE_NODE


def test_forms_of_one_device_know_their_claims() -> None:
    assert whole("n", 0).claim == Claim("GPU-n-0")
    assert migs("n", 0, 2)[1].claim == Claim("GPU-n-0", "n:gpu.mig:0.1")
    vf = AtomSlot("n:nic.vf:x", "nic.vf", True, {"sriov": True}, "0000:01:00.0")
    nic = AtomSlot("n:nic:x", "nic.vf", True, {"sriov": False}, "0000:01:00.0")
    assert vf.claim == Claim("0000:01:00.0", "n:nic.vf:x") and nic.claim == Claim("0000:01:00.0")


def test_a_whole_gpu_hold_blocks_that_gpus_mig_and_slot_forms_and_vice_versa() -> None:
    # Device 0 shows every form at once (as a ledger mid-reconfiguration might).
    forms = [whole("n", 0), *migs("n", 0, 2), *slots("n", 0, 2), whole("n", 1)]
    snap = PoolSnapshot((host("n", forms),))
    on_whole = replace(snap, held={"n": (hold("n:gpu:0", Claim("GPU-n-0"), "r"),)})
    assert taken(on_whole, ask("gpu.mig", 1)) == set()
    assert taken(on_whole, ask("gpu.slot", 1)) == set()
    assert taken(on_whole, ask("gpu", 1)) == {"n:gpu:1"}
    mig_claim = migs("n", 0, 2)[0].claim
    on_mig = replace(snap, held={"n": (hold("n:gpu.mig:0.0", mig_claim, "r"),)})
    assert taken(on_mig, ask("gpu", 2)) == set()  # GPU 0 whole is not free
    assert taken(on_mig, ask("gpu.mig", 1)) == {"n:gpu.mig:0.1"}  # its sibling is
    assert taken(on_mig, ask("gpu.mig", 2)) == set()


def test_one_request_never_takes_two_forms_of_one_device() -> None:
    snap = PoolSnapshot((host("n", [whole("n", 0), *migs("n", 0, 2)]),))
    both = PlacementRequest(devices=(DeviceRequest("gpu", 1), DeviceRequest("gpu.mig", 1)))
    assert not place(both, snap).fits


def test_a_booking_on_a_retired_form_blocks_the_devices_new_forms() -> None:
    # GPU 0 was whole when booked; it now shows as 4 time-slice slots.
    snap = PoolSnapshot((host("n", [*slots("n", 0, 4), *slots("n", 1, 4)]),))
    old = stale_claim("n:gpu:GPU-n-0", "gpu", "GPU-n-0")
    snap = replace(snap, held={"n": (hold("n:gpu:GPU-n-0", old, "r"),)})
    got = taken(snap, ask("gpu.slot", 4))
    assert got == {f"n:gpu.slot:1:{k}" for k in range(4)}
    assert taken(snap, ask("gpu.slot", 5)) == set()
    # A node-wide booking takes every device of the node.
    on_node = replace(snap, held={"n": (hold("n:node", WHOLE_NODE, "r"),)})
    assert not place(ask("gpu.slot", 1), on_node).fits


def test_a_whole_node_is_refused_under_a_booking_on_a_retired_form() -> None:
    snap = PoolSnapshot((host("n", [whole("n", 0)]),))
    gone = stale_claim("n:gpu.mig:old", "gpu.mig", "GPU-n-9")
    snap = replace(snap, held={"n": (hold("n:gpu.mig:old", gone, "r"),)})
    assert not place(ask("gpu", 1, binding="node"), snap).fits


# --- NVLink cliques ----------------------------------------------------------------


def linked_node(node_id: str, peers: dict[int, set[int]], label: str = "nvl0") -> NodeSlot:
    atoms = [
        replace(
            whole(node_id, i, nvlinkClique=label),
            peers=frozenset(f"GPU-{node_id}-{j}" for j in linked),
        )
        for i, linked in sorted(peers.items())
    ]
    return host(node_id, atoms)


def test_peer_sets_from_bridges_and_switches() -> None:
    chain = peer_sets(
        [
            ("G0", "0000:01:00.0", ["0000:02:00.0"]),
            ("G1", "00000000:02:00.0", ["0000:01:00.0", "0000:03:00.0"]),
            ("G2", "0000:03:00.0", ["0000:02:00.0", "0000:04:00.0"]),
            ("G3", "0000:04:00.0", ["0000:03:00.0"]),
        ]
    )
    assert chain["G0"] == {"G1"} and chain["G1"] == {"G0", "G2"} and chain["G3"] == {"G2"}
    switched = peer_sets([(f"G{i}", f"0000:0{i}:00.0", ["0000:a0:00.0"]) for i in range(4)])
    assert all(switched[f"G{i}"] == {f"G{j}" for j in range(4)} - {f"G{i}"} for i in range(4))
    assert peer_sets([("G0", "0000:01:00.0", [])]) == {"G0": frozenset()}


def test_a_chain_of_bridges_is_not_one_clique() -> None:
    # The agent names the connected component 0-1-2-3 "nvl0"; only pairs share a link.
    chain = linked_node("c", {0: {1}, 1: {0, 2}, 2: {1, 3}, 3: {2}})
    snap = PoolSnapshot((chain,))
    assert not place(ask("gpu", 4, topology="nvlink-all"), snap).fits
    assert not place(ask("gpu", 3, topology="nvlink-all"), snap).fits
    pair = taken(snap, ask("gpu", 2, topology="nvlink-all"))
    assert pair in ({"c:gpu:0", "c:gpu:1"}, {"c:gpu:1", "c:gpu:2"}, {"c:gpu:2", "c:gpu:3"})
    failed = place(ask("gpu", 4, topology="nvlink-all"), snap)
    assert (failed.shortfalls[0].requested, failed.shortfalls[0].available) == (4, 2)
    assert place(ask("gpu", 4), snap).fits


def test_an_nvswitch_node_is_one_clique() -> None:
    everyone = {i: set(range(8)) - {i} for i in range(8)}
    snap = PoolSnapshot((linked_node("s", everyone),))
    assert len(taken(snap, ask("gpu", 8, topology="nvlink-all"))) == 8


def test_request_wide_nvlink_all_puts_every_entry_in_one_clique() -> None:
    # Two cliques of two on "split", one clique of four on "quad".
    split = linked_node("split", {0: {1}, 1: {0}, 2: {3}, 3: {2}})
    two_and_two = PlacementRequest(
        devices=(DeviceRequest("gpu", 2), DeviceRequest("gpu", 2)), topology="nvlink-all"
    )
    only_split = PoolSnapshot((split,))
    failed = place(two_and_two, only_split)
    assert not failed.fits
    assert "whole request" in failed.shortfalls[0].reason
    assert failed.filtered == {"too few NVLink-connected free gpu for the whole request": 1}
    quad = linked_node("quad", {i: set(range(4)) - {i} for i in range(4)})
    result = place(two_and_two, PoolSnapshot((split, quad)))
    assert [c.node_id for c in result.candidates] == ["quad"]
    # Per-entry topology still means one clique per entry.
    per_entry = PlacementRequest(
        devices=(
            DeviceRequest("gpu", 2, topology="nvlink-all"),
            DeviceRequest("gpu", 2, topology="nvlink-all"),
        )
    )
    assert place(per_entry, only_split).fits


def test_request_wide_cliques_from_labels_when_no_link_matrix() -> None:
    atoms = [whole("n", i, nvlinkClique=f"nvl{i // 2}") for i in range(4)]
    req = PlacementRequest(
        devices=(DeviceRequest("gpu", 1), DeviceRequest("gpu", 1)), topology="nvlink-all"
    )
    got = taken(PoolSnapshot((host("n", atoms),)), req)
    assert got in ({"n:gpu:0", "n:gpu:1"}, {"n:gpu:2", "n:gpu:3"})


# --- minimal preemption ------------------------------------------------------------


def test_preemption_notices_only_the_spot_holders_of_what_it_takes() -> None:
    snap = PoolSnapshot((host("n", [whole("n", i) for i in range(4)]),))
    snap = replace(
        snap,
        held={"n": (hold("n:gpu:0", Claim("GPU-n-0"), "spot-a", spot=True),)},
        scalar_holders={
            "n": {
                "memoryGiB": (
                    (600, Holder("spot-big", True)),
                    (300, Holder("spot-mid", True)),
                    (100, Holder("spot-small", True)),
                    (20, Holder("regular", False)),
                )
            }
        },
    )
    # 1024 GiB, 1020 held: 500 asked frees the one 600 GiB holder, nobody else, and the
    # GPU it takes is a free one, not spot-a's.
    req = replace(ask("gpu", 1), resources=(("memoryGiB", 500),))
    result = place(req, snap, ignore_spot=True)
    assert result.fits and result.victims == {"spot-big"}
    assert result.candidates[0].atoms[0].atom_id != "n:gpu:0"
    # 900 asked: two holders at least, the largest first.
    more = place(replace(req, resources=(("memoryGiB", 900),)), snap, ignore_spot=True)
    assert more.victims == {"spot-big", "spot-mid"}
    # More than every spot holder frees does not fit at all.
    assert not place(replace(req, resources=(("memoryGiB", 1010),)), snap, ignore_spot=True).fits


def test_a_spot_holder_already_noticed_for_a_gpu_pays_for_its_memory_too() -> None:
    snap = PoolSnapshot((host("n", [whole("n", 0)]),))
    snap = replace(
        snap,
        held={"n": (hold("n:gpu:0", Claim("GPU-n-0"), "spot-gpu", spot=True),)},
        scalar_holders={
            "n": {"memoryGiB": ((512, Holder("spot-gpu", True)), (512, Holder("spot-mem", True)))}
        },
    )
    req = replace(ask("gpu", 1), resources=(("memoryGiB", 400),))
    assert place(req, snap, ignore_spot=True).victims == {"spot-gpu"}


def test_a_spot_booking_on_a_retired_form_is_noticed_when_its_device_is_taken() -> None:
    snap = PoolSnapshot((host("n", slots("n", 0, 2)),))
    old = stale_claim("n:gpu:GPU-n-0", "gpu", "GPU-n-0")
    snap = replace(snap, held={"n": (hold("n:gpu:GPU-n-0", old, "spot-old", spot=True),)})
    assert not place(ask("gpu.slot", 1), snap).fits
    assert place(ask("gpu.slot", 1), snap, ignore_spot=True).victims == {"spot-old"}


# --- why not: counted as filtered --------------------------------------------------


def test_filtered_nodes_are_counted_by_reason_and_the_shortfall_reads_them() -> None:
    down = NodeState(reachable=True, health="healthy", maintenance=True, provisioning=False)
    nodes = (
        host("m", [whole("m", 0)], state=down),
        host("p", [whole("p", 0)], profile="other"),
        linked_node("a", {0: {1}, 1: {0}, 2: set()}),
        linked_node("b", {0: {1}, 1: {0}, 2: set()}),
    )
    req = replace(ask("gpu", 3, topology="nvlink-all"), profile_id="std")
    failed = place(req, PoolSnapshot(nodes))
    assert failed.filtered == {
        "not allocatable: maintenance": 1,
        "profile mismatch": 1,
        "too few NVLink-connected free gpu for the whole request": 2,
    }
    short = failed.shortfalls[0]
    assert (short.requested, short.available) == (3, 2)
    assert short.reason == "at most 2 free NVLink-connected gpu matching on one node"
    assert failed.reason == (
        "no node can take the whole request: too few NVLink-connected free gpu for the "
        "whole request on 2 nodes, not allocatable: maintenance on 1 node, "
        "profile mismatch on 1 node"
    )
    fits = place(replace(req, devices=(DeviceRequest("gpu", 2),)), PoolSnapshot(nodes))
    assert fits.fits and fits.filtered == {"not allocatable: maintenance": 1, "profile mismatch": 1}


def test_scalar_shortfall_says_the_most_any_node_has() -> None:
    nodes = (host("a", [whole("a", 0)]), host("b", [whole("b", 0)]))
    snap = PoolSnapshot(nodes, scalar_holders={"a": {"memoryGiB": ((1000, Holder("r", False)),)}})
    req = replace(ask("gpu", 1), resources=(("memoryGiB", 2000),))
    failed = place(req, snap)
    assert failed.filtered == {"too little free memoryGiB": 2}
    assert failed.shortfalls[0].reason == (
        "at most 1024 memoryGiB free on one node in the window, 2000 asked"
    )
