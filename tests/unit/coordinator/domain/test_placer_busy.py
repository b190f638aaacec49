"""A GPU in unbooked use goes last (issue 31, point 6): within a node after its idle
GPUs, across nodes after every node that fits without one, and the placement's
warnings name each busy GPU a booking would take."""

from __future__ import annotations

from coordinator.domain.booking import preview
from coordinator.domain.node_fit import busy_allocatable
from coordinator.domain.placement_model import (
    AtomSlot,
    DeviceRequest,
    NodeSlot,
    PlacementRequest,
    PoolSnapshot,
)
from coordinator.domain.placer import place
from tests.unit.coordinator.domain.test_placer import book, gpus, node


def test_within_a_node_the_idle_gpus_go_first_and_a_busy_one_is_named() -> None:
    snap = PoolSnapshot((node("a", gpus=4),))
    busy = {("a", "GPU-a-0")}
    two = place(gpus(2), snap, busy=busy)
    assert [x.atom_id for x in two.candidates[0].atoms] == ["a:gpu:1", "a:gpu:2"]
    assert two.warnings == ()
    four = place(gpus(4), snap, busy=busy)
    assert four.fits and four.candidates[0].busy == ("a:gpu:0",)
    (warning,) = four.warnings
    assert "a:gpu:0" in warning and "node a" in warning
    # Nothing busy: the placement is the one it always was.
    assert place(gpus(2), snap).candidates[0].atoms[0].atom_id == "a:gpu:0"


def test_a_node_that_fits_without_a_busy_gpu_goes_before_a_tighter_one_that_does_not() -> None:
    # "a" packs better (one GPU left free), but its free GPU is in unbooked use.
    snap = book(PoolSnapshot((node("a", gpus=2), node("b", gpus=4))), ["a:gpu:1"], "r")
    busy = {("a", "GPU-a-0")}
    assert place(gpus(1), snap).candidates[0].node_id == "a"
    taken = place(gpus(1), snap, busy=busy, limit=1)
    assert taken.candidates[0].node_id == "b" and taken.warnings == ()
    ranked = place(gpus(1), snap, busy=busy)
    assert [c.node_id for c in ranked.candidates] == ["b", "a"]


def test_an_nvlink_request_takes_the_clique_without_a_busy_gpu() -> None:
    snap = PoolSnapshot((node("a", gpus=4, cliques=2),))
    busy = {("a", "GPU-a-1")}
    got = place(gpus(2, topology="nvlink-all"), snap, busy=busy)
    assert [x.atom_id for x in got.candidates[0].atoms] == ["a:gpu:2", "a:gpu:3"]
    assert got.warnings == ()


class _Pool:
    def __init__(self, snap: PoolSnapshot) -> None:
        self.snap = snap

    def snapshot(self, start: int, end: int) -> PoolSnapshot:
        return self.snap


def test_preview_warns_and_the_rollup_counts_allocatable_busy_gpus() -> None:
    snap = PoolSnapshot((node("a", gpus=2, sick=(1,)),))
    busy = {("a", "GPU-a-0"), ("a", "GPU-a-1"), ("gone", "GPU-gone-0")}
    seen = preview(_Pool(snap), gpus(1), 0, 1000, 0, 0, busy)  # type: ignore[arg-type]
    assert seen.placement.fits and len(seen.warnings) == 1
    # The faulty GPU is not allocatable, whatever runs on it.
    assert busy_allocatable(snap.nodes, busy) == 1
    assert busy_allocatable(snap.nodes, frozenset()) == 0


def test_a_mig_instance_in_unbooked_use_goes_after_the_idle_one_on_its_gpu() -> None:
    """Use is reported per MIG instance: its `uuid` attribute, else its atom id's last
    part. The instance in use is taken last, whichever way it is named, and the other
    instance on the same GPU is not."""
    atoms = (
        AtomSlot("a:gpu.mig:MIG-a-0", "gpu.mig", True, {"uuid": "MIG-a-0"}, "GPU-a-0"),
        AtomSlot("a:gpu.mig:MIG-a-1", "gpu.mig", True, {}, "GPU-a-0"),
    )
    snap = PoolSnapshot((NodeSlot("a", node("a").state, {}, "std", 1, atoms, {"vcpu": 8}),))
    one = PlacementRequest(devices=(DeviceRequest("gpu.mig", 1),))
    for busy_uuid, idle in (("MIG-a-0", "a:gpu.mig:MIG-a-1"), ("MIG-a-1", "a:gpu.mig:MIG-a-0")):
        taken = place(one, snap, busy={("a", busy_uuid)})
        assert [x.atom_id for x in taken.candidates[0].atoms] == [idle], busy_uuid
        assert taken.warnings == ()


def test_a_whole_node_with_a_gpu_in_unbooked_use_goes_last_and_is_named() -> None:
    snap = PoolSnapshot((node("a", gpus=2), node("b", gpus=2)))
    busy = {("a", "GPU-a-1")}
    whole = place(gpus(1, binding="node"), snap, busy=busy)
    assert [c.node_id for c in whole.candidates] == ["b", "a"]
    assert whole.warnings == () and whole.candidates[1].busy == ("a:gpu:1",)
    only = place(gpus(1, binding="node"), PoolSnapshot((node("a", gpus=2),)), busy=busy)
    (warning,) = only.warnings
    assert "a:gpu:1" in warning and "node a" in warning


def test_a_gang_takes_the_nodes_without_a_gpu_in_unbooked_use_first() -> None:
    nodes = (node("a", gpus=2), node("b", gpus=2), node("c", gpus=2))
    gang = place(gpus(2, gang_size=2), PoolSnapshot(nodes), busy={("a", "GPU-a-0")})
    assert sorted(c.node_id for c in gang.chosen) == ["b", "c"] and gang.warnings == ()
