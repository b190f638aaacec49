"""Inventories no host can have are refused (SPEC §4): every atom backed by a device the
inventory lists, within plausibility bounds. What real agents send passes."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from agent.inventory import Identity, SharingRule, build_inventory
from agent.reader import NvmlReader
from agent.sim.nvml import SimulatedNvml
from agent.sim.profile import load_profile
from agent.sim.sysfs_tree import build_tree
from agent.sysfs import read_host
from coordinator.domain.inventory_truth import MAX_GPUS_PER_NODE, untrue
from shared.ids import new_pool_id
from shared.wire import Atom, Inventory, Scalars
from tests.factories import make_inventory, unchecked

POOL = new_pool_id()


def agent_inventory(profile: str, tmp_path: Path, **kw: object) -> Inventory:
    prof = load_profile(profile)
    snap = NvmlReader(SimulatedNvml(prof, "n1"), cpu_count=prof.vcpu).read()
    host = read_host(build_tree(tmp_path, prof))
    return build_inventory(
        Identity(node_id="n1", pool_id=POOL, profile_id=prof.id),
        snap,
        host,
        boot_id="b",
        sent_at=1,
        **kw,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("profile", ["h100-sxm-8", "a100-mig-8", "l40s-pcie-4"])
def test_what_the_agent_reports_of_every_shipped_host_is_true(profile: str, tmp_path: Path) -> None:
    inv = agent_inventory(profile, tmp_path, offer_boot_disks=True, offer_management_nics=True)
    assert untrue(inv) is None


def test_time_sliced_gpus_and_expected_shortfalls_are_true(tmp_path: Path) -> None:
    shared = (SharingRule(gpus=("all",), mode="timeslice", replicas=4),)
    inv = agent_inventory("l40s-pcie-4", tmp_path, sharing=shared, expected={"disk": 12})
    assert {a.cls for a in inv.atoms} >= {"gpu.slot", "disk"}
    assert any(a.device_id.startswith("missing:") for a in inv.atoms)
    assert untrue(inv) is None


def _with_atoms(inv: Inventory, *extra: Atom) -> Inventory:
    return unchecked(inv, atoms=(*inv.atoms, *extra))


def test_gpu_atoms_without_gpus_are_refused() -> None:
    """The review's forged inventory: no GPUs listed, 5,000 `gpu` atoms."""
    inv = make_inventory("n0", POOL, gpus=0)
    forged = _with_atoms(
        inv, *(Atom(atom_id=f"n0:gpu:G{i}", cls="gpu", device_id=f"G{i}") for i in range(5000))
    )
    finding = untrue(forged)
    assert finding is not None and finding.reason == "unbacked_atom"
    assert "n0:gpu:G0" in finding.message


@pytest.mark.parametrize(
    ("atom", "words"),
    [
        # A second whole-GPU atom for one GPU.
        (Atom(atom_id="n0:gpu:again", cls="gpu", device_id="GPU-n0-0"), "more than once"),
        # A MIG instance the GPU does not have, and one on a GPU that is not in MIG mode.
        (
            Atom(atom_id="n0:gpu.mig:X", cls="gpu.mig", device_id="GPU-n0-mig",
                 attrs={"uuid": "MIG-9"}),
            "MIG instance",
        ),
        (
            Atom(atom_id="n0:gpu.mig:Y", cls="gpu.mig", device_id="GPU-n0-0",
                 attrs={"uuid": "MIG-0"}),
            "no MIG-enabled GPU",
        ),
        # Slots of a GPU nobody shares.
        (Atom(atom_id="n0:gpu.slot:G:0", cls="gpu.slot", device_id="GPU-n0-0"), "shared GPU"),
        (Atom(atom_id="n0:nic.vf:x", cls="nic.vf", device_id="nic9"), "no NIC"),
        (Atom(atom_id="n0:nic.vf:y", cls="nic.vf", device_id="nic0"), "at most 1"),
        (Atom(atom_id="n0:disk:z", cls="disk", device_id="nvme7"), "no disk"),
        (Atom(atom_id="n0:node2", cls="node"), "2 node atoms"),
    ],
)  # fmt: skip
def test_each_class_needs_its_own_device(atom: Atom, words: str) -> None:
    inv = make_inventory("n0", POOL, gpus=2, mig=2, nics=1, disks=1)
    assert untrue(inv) is None
    finding = untrue(_with_atoms(inv, atom))
    assert finding is not None and finding.reason == "unbacked_atom"
    assert words in finding.message


def test_vfs_are_bounded_by_the_nics_sriov_total(tmp_path: Path) -> None:
    inv = agent_inventory("h100-sxm-8", tmp_path)
    nic = next(n for n in inv.nics if n.vfs)
    short = unchecked(nic, sriov_total_vfs=len(nic.vfs) - 1)
    lying = unchecked(inv, nics=tuple(short if n is nic else n for n in inv.nics))
    finding = untrue(lying)
    assert finding is not None and "sriov_total_vfs" in finding.message


def test_a_vf_naming_another_cards_identity_is_refused(tmp_path: Path) -> None:
    """An atom may carry only its own NIC's card identity (issue 31): else it could hold
    or free an identity its host does not have."""
    inv = agent_inventory("h100-sxm-8", tmp_path)
    vf = next(a for a in inv.atoms if a.cls == "nic.vf")
    assert str(vf.attrs["physicalId"]).startswith("guid:")
    other = msgspec.structs.replace(vf, attrs={**vf.attrs, "physicalId": "mac:b8:ce:f6:0:0:1"})
    finding = untrue(unchecked(inv, atoms=tuple(other if a is vf else a for a in inv.atoms)))
    assert finding is not None and finding.reason == "unbacked_atom"
    assert "NIC identity 'mac:b8:ce:f6:0:0:1'" in finding.message


@pytest.mark.parametrize(
    ("scalars", "gpus", "words"),
    [
        (Scalars(vcpu=5000), 0, "vCPU"),
        (Scalars(memory_gib=70_000), 0, "memory"),
        (Scalars(memory_gib=64, hugepages_1gi=65), 0, "huge pages"),
        (Scalars(), MAX_GPUS_PER_NODE + 1, "GPUs on one node"),
    ],
)
def test_hosts_past_plausibility_bounds_are_refused(
    scalars: Scalars, gpus: int, words: str
) -> None:
    inv = unchecked(make_inventory("n0", POOL, gpus=gpus), scalars=scalars)
    finding = untrue(inv)
    assert finding is not None and finding.reason == "implausible_host"
    assert words in finding.message
