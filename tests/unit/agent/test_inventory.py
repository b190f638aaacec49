"""Inventory from simulated hosts: atoms per class, ids, attributes, cliques, hash."""

from __future__ import annotations

from pathlib import Path

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.inventory import Identity, SharingRule, build_inventory, inventory_hash, nvlink_cliques
from agent.reader import NvmlReader
from agent.readings import GpuReading, HostReading, NicReading, NvmlSnapshot
from agent.sim.nvml import SimulatedNvml
from agent.sim.profile import load_profile
from agent.sim.sysfs_tree import build_tree
from agent.sysfs import read_host
from shared.ids import new_pool_id
from shared.wire import CpuTopology, Inventory, NodeHealth

POOL = new_pool_id()


def inventory_of(profile: str, tmp_path: Path, node: str = "n1", **kw: object) -> Inventory:
    prof = load_profile(profile)
    snap = NvmlReader(SimulatedNvml(prof, node), cpu_count=prof.vcpu).read()
    host = read_host(build_tree(tmp_path / node, prof))
    sharing = kw.pop("sharing", ())
    ident = Identity(node_id=node, pool_id=POOL, profile_id=prof.id, **kw)  # type: ignore[arg-type]
    return build_inventory(ident, snap, host, sharing, boot_id="b", sent_at=1)  # type: ignore[arg-type]


def classes(inv: Inventory) -> dict[str, int]:
    out: dict[str, int] = {}
    for atom in inv.atoms:
        out[atom.cls] = out.get(atom.cls, 0) + 1
    return out


def test_h100_atoms_and_attributes(tmp_path: Path) -> None:
    inv = inventory_of("h100-sxm-8", tmp_path)
    # eno1 holds the default route and sda the root filesystem: neither is bookable.
    assert classes(inv) == {"node": 1, "gpu": 8, "nic.vf": 32, "disk": 8}
    gpu = next(a for a in inv.atoms if a.cls == "gpu" and a.attrs["gpuIndex"] == 5)
    assert gpu.atom_id == f"n1:gpu:{gpu.device_id}"
    assert gpu.device_id.startswith("GPU-")
    assert gpu.attrs["model"] == "NVIDIA H100 80GB HBM3"
    assert gpu.attrs["memoryMiB"] == 81559
    assert gpu.attrs["pciBusId"] == "0000:ab:00.0"
    assert gpu.attrs["numaNode"] == 1
    assert gpu.attrs["nvlinkClique"] == "nvl0"
    assert gpu.attrs["computeCapability"] == "9.0"
    info = inv.gpus[5]
    # Two sockets of 56 cores, two threads each, numbered as Linux does: socket 1 is
    # cores 56-111, its second threads CPUs 168-223.
    assert info.cpu_affinity == "56-111,168-223"
    assert inv.cpu_topology == CpuTopology(sockets=2, cores_per_socket=56, threads_per_core=2)
    assert info.nvlink_peers == ("0000:05:00.0", "0000:06:00.0", "0000:07:00.0", "0000:08:00.0")
    assert inv.driver_version == "550.54.15" and inv.cuda_version == "12.4"
    assert inv.labels["gpu.model"] == "NVIDIA H100 80GB HBM3"
    assert inv.labels["nvlink.cliques"] == "1"


def test_nics_yield_one_atom_per_vf_or_one_per_plain_nic(tmp_path: Path) -> None:
    inv = inventory_of("h100-sxm-8", tmp_path)
    vfs = [a for a in inv.atoms if a.cls == "nic.vf" and a.attrs["sriov"]]
    plain = [a for a in inv.atoms if a.cls == "nic.vf" and not a.attrs["sriov"]]
    assert len(vfs) == 32
    assert plain == []  # eno1 is the management NIC
    assert [(n.name, n.bookable) for n in inv.nics][:2] == [("eno1", False), ("ibp0s0", True)]
    vf = next(a for a in vfs if a.attrs["pciAddress"] == "0000:1a:00.2")
    assert vf.device_id == "0000:1a:00.0"  # the PF's health moves its VFs
    assert vf.attrs["model"] == "ConnectX-7" and vf.attrs["speedMbps"] == 400000
    assert vf.attrs["vfIndex"] == 1


def test_mig_gpus_yield_mig_atoms_and_no_gpu_atom(tmp_path: Path) -> None:
    inv = inventory_of("a100-mig-8", tmp_path)
    assert classes(inv)["gpu"] == 6
    assert classes(inv)["gpu.mig"] == 11
    migs = [a for a in inv.atoms if a.cls == "gpu.mig"]
    parent0 = inv.gpus[0].uuid
    assert not any(a.cls == "gpu" and a.device_id == parent0 for a in inv.atoms)
    on0 = sorted(str(a.attrs["profile"]) for a in migs if a.device_id == parent0)
    assert on0 == ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]
    big = next(a for a in migs if a.attrs["profile"] == "3g.40gb")
    assert big.attrs["memoryMiB"] == 40192
    assert str(big.attrs["uuid"]).startswith("MIG-")
    assert big.atom_id == f"n1:gpu.mig:{big.attrs['uuid']}"
    assert inv.gpus[0].mig_enabled and len(inv.gpus[1].mig_instances) == 7


def test_sharing_rules_by_index_uuid_and_all(tmp_path: Path) -> None:
    plain = inventory_of("l40s-pcie-4", tmp_path / "a")
    uuid3 = plain.gpus[3].uuid
    rules = (
        SharingRule(gpus=("0", uuid3), mode="mps", replicas=2),
        SharingRule(gpus=("all",), mode="timeslice", replicas=4),
    )
    inv = inventory_of("l40s-pcie-4", tmp_path / "b", sharing=rules)
    assert classes(inv) == {"node": 1, "gpu.slot": 2 + 4 + 4 + 2, "nic.vf": 4, "disk": 2}
    slots = [a for a in inv.atoms if a.cls == "gpu.slot" and a.device_id == uuid3]
    assert [a.attrs["replica"] for a in slots] == [0, 1]
    assert {a.attrs["sharing"] for a in slots} == {"mps"}
    assert inv.gpus[1].sharing == "timeslice" and inv.gpus[1].replicas == 4


def test_sharing_does_not_apply_to_mig_gpus(tmp_path: Path) -> None:
    rules = (SharingRule(gpus=("all",), mode="timeslice", replicas=2),)
    inv = inventory_of("a100-mig-8", tmp_path, sharing=rules)
    assert classes(inv)["gpu.mig"] == 11 and classes(inv)["gpu.slot"] == 12


def test_pcie_gpus_have_no_nvlink_clique(tmp_path: Path) -> None:
    inv = inventory_of("l40s-pcie-4", tmp_path)
    assert all(a.attrs.get("nvlinkClique") is None for a in inv.atoms if a.cls == "gpu")
    assert inv.labels["nvlink.cliques"] == "0"


def test_atom_ids_unique_and_stable_across_reads(tmp_path: Path) -> None:
    a = inventory_of("a100-mig-8", tmp_path / "a")
    b = inventory_of("a100-mig-8", tmp_path / "b")
    assert len({x.atom_id for x in a.atoms}) == len(a.atoms)
    assert [x.atom_id for x in a.atoms] == [x.atom_id for x in b.atoms]
    assert a.inventory_hash == b.inventory_hash


def test_other_nodes_get_other_uuids(tmp_path: Path) -> None:
    a = inventory_of("h100-sxm-8", tmp_path, node="n1")
    b = inventory_of("h100-sxm-8", tmp_path, node="n2")
    assert not {g.uuid for g in a.gpus} & {g.uuid for g in b.gpus}


def test_hash_ignores_send_fields_and_health_but_not_content(tmp_path: Path) -> None:
    inv = inventory_of("l40s-pcie-4", tmp_path)
    moved = msgspec.structs.replace(
        inv, sent_at=99, boot_id="other", health=NodeHealth(status="unhealthy")
    )
    assert inventory_hash(moved) == inv.inventory_hash
    relabelled = inventory_of("l40s-pcie-4", tmp_path / "x", labels=(("rack", "r2"),))
    assert relabelled.inventory_hash != inv.inventory_hash
    assert len(inv.inventory_hash) == 64


def test_json_round_trip_is_valid_wire(tmp_path: Path) -> None:
    inv = inventory_of("a100-mig-8", tmp_path)
    again = Inventory.from_json(inv.to_json())
    assert again == inv


def gpu(index: int, remotes: tuple[str, ...]) -> GpuReading:
    return GpuReading(
        index=index,
        uuid=f"GPU-{index}",
        name="x",
        memory_mib=1,
        pci_bus_id=f"0000:{index:02x}:00.0",
        nvlink_remotes=remotes,
    )


def test_switch_and_bridge_groups_are_cliques() -> None:
    # 0-1 bridged directly, 2 and 3 through one switch, 4 alone.
    gpus = [
        gpu(3, ("0000:f0:00.0",)),
        gpu(0, ("0000:01:00.0",)),
        gpu(1, ("0000:00:00.0",)),
        gpu(2, ("0000:f0:00.0",)),
        gpu(4, ()),
    ]
    assert nvlink_cliques(gpus) == {
        "GPU-0": "nvl0",
        "GPU-1": "nvl0",
        "GPU-2": "nvl1",
        "GPU-3": "nvl1",
    }


def test_a_chain_of_bridges_is_not_one_clique() -> None:
    """SPEC §5: 0–1–2–3 bridged in a chain is connected, but 0 and 2 share no NVLink, so
    no label may put them together."""
    pci = [f"0000:{i:02x}:00.0" for i in range(4)]
    gpus = [gpu(i, tuple(pci[j] for j in (i - 1, i + 1) if 0 <= j < 4)) for i in range(4)]
    assert nvlink_cliques(gpus) == {
        "GPU-0": "nvl0",
        "GPU-1": "nvl0",
        "GPU-2": "nvl1",
        "GPU-3": "nvl1",
    }


@settings(max_examples=200, deadline=None)
@given(
    st.integers(2, 8).flatmap(
        lambda n: st.tuples(
            st.just(n),
            st.sets(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=n * n),
        )
    )
)
def test_every_label_names_a_clique_and_the_first_a_largest_one(
    graph: tuple[int, set[tuple[int, int]]],
) -> None:
    n, edges = graph
    links = {(a, b) for a, b in edges if a != b} | {(b, a) for a, b in edges if a != b}
    pci = [f"0000:{i:02x}:00.0" for i in range(n)]
    gpus = [gpu(i, tuple(pci[j] for j in range(n) if (i, j) in links)) for i in range(n)]
    labels = nvlink_cliques(gpus)
    groups: dict[str, list[int]] = {}
    for uuid, label in labels.items():
        groups.setdefault(label, []).append(int(uuid.removeprefix("GPU-")))
    for members in groups.values():
        assert all((a, b) in links for a in members for b in members if a != b), members
    linked = {a for a, _ in links}
    assert set(labels) == {f"GPU-{i}" for i in linked}
    if groups:
        largest = max(len(c) for c in _cliques_by_brute_force(n, links))
        assert len(groups["nvl0"]) == largest


def _cliques_by_brute_force(n: int, links: set[tuple[int, int]]) -> list[list[int]]:
    out = []
    for mask in range(1, 1 << n):
        members = [i for i in range(n) if mask >> i & 1]
        if all((a, b) in links for a in members for b in members if a != b):
            out.append(members)
    return out


def test_no_gpus_means_only_the_node_atom() -> None:
    inv = build_inventory(
        Identity(node_id="n", pool_id=POOL),
        NvmlSnapshot(),
        HostReading(vcpu=4),
        boot_id="b",
        sent_at=0,
    )
    assert [a.cls for a in inv.atoms] == ["node"]
    assert inv.scalars.vcpu == 4


def test_boot_disk_and_management_nic_offered_only_when_configured(tmp_path: Path) -> None:
    prof = load_profile("h100-sxm-8")
    snap = NvmlReader(SimulatedNvml(prof, "n1"), cpu_count=prof.vcpu).read()
    host = read_host(build_tree(tmp_path, prof))
    ident = Identity(node_id="n1", pool_id=POOL)
    inv = build_inventory(
        ident,
        snap,
        host,
        boot_id="b",
        sent_at=1,
        offer_boot_disks=True,
        offer_management_nics=True,
    )
    assert classes(inv) == {"node": 1, "gpu": 8, "nic.vf": 33, "disk": 9}
    sda = next(a for a in inv.atoms if a.cls == "disk" and a.attrs["name"] == "sda")
    assert sda.device_id.startswith("wwn:naa.") and sda.atom_id == f"n1:disk:{sda.device_id}"
    assert all(d.bookable for d in inv.disks) and all(n.bookable for n in inv.nics)


def test_two_readings_of_one_pci_function_give_no_duplicate_atoms() -> None:
    nic = NicReading(
        name="enp1s0f0np0",
        pci_address="0000:01:00.0",
        speed_mbps=None,
        numa_node=None,
        model=None,
        sriov_total_vfs=4,
        sriov_num_vfs=2,
        vfs=("0000:01:00.1", "0000:01:00.2"),
    )
    rep = msgspec.structs.replace(nic, name="eth5")
    inv = build_inventory(
        Identity(node_id="n1", pool_id=POOL),
        NvmlSnapshot(),
        HostReading(nics=(nic, rep)),
        boot_id="b",
        sent_at=1,
    )
    assert classes(inv) == {"node": 1, "nic.vf": 2} and len(inv.nics) == 1
