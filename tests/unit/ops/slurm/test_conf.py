"""`gpufleet slurm conf`'s rendering (ops/slurm/conf.py) from simulated hosts' inventories
as `nodes.inventories` answers them: gres.conf lines with types, files, cores and links,
MIG instances as their own types, NodeName lines, topology.conf; and its invariants."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.api.methods.hardware import gpu_out, topology_out
from coordinator.api.shapes.base import dump
from ops.slurm.conf import (
    Gpu,
    Mig,
    Node,
    Options,
    SlurmConfError,
    cores,
    links,
    nodes_from_api,
    render,
    render_pools,
)
from shared.slurm_gres import short_model
from shared.wire import Inventory
from tests.unit.agent.test_inventory import inventory_of


def api_node(inv: Inventory, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A node as nodes.inventories answers it (the API's own GPU model, dumped)."""
    return {
        "nodeId": inv.node_id,
        "hostname": inv.hostname,
        "labels": {**inv.labels, **(labels or {})},
        "resources": {
            "vcpu": inv.scalars.vcpu,
            "memoryGiB": inv.scalars.memory_gib,
            "hugepages1Gi": inv.scalars.hugepages_1gi,
        },
        "reported": True,
        "gpus": [dump(gpu_out(g)) for g in inv.gpus],
        "cpuTopology": dump(t) if (t := topology_out(inv.cpu_topology)) else None,
    }


def gres_of(text: str, node: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(f"NodeName={node} ")]


def test_h100_gpus_with_files_cores_links_and_the_node_line(tmp_path: Path) -> None:
    """The simulated HGX host is 2 sockets x 56 cores x 2 threads, as sysfs lays it out:
    the node line says so as `slurmd -C` would, and each GPU's Cores= are the cores of
    its socket (its affinity 0-55,112-167 folded to cores), none past the host's 112."""
    nodes = nodes_from_api([api_node(inventory_of("h100-sxm-8", tmp_path, "h100-a"))])
    assert nodes[0].topology == (2, 56, 2)
    conf = render("train", nodes)
    lines = gres_of(conf.gres, "h100-a")
    assert len(lines) == 8
    four = "4,4,4,4,4,4,4"  # every pair reaches the same 4 NVSwitches
    assert lines[0] == (
        f"NodeName=h100-a Name=gpu Type=h100 File=/dev/nvidia0 Cores=0-55 Links=-1,{four}"
    )
    assert lines[5].endswith("File=/dev/nvidia5 Cores=56-111 Links=4,4,4,4,4,-1,4,4")
    (node_line,) = [x for x in conf.nodes.splitlines() if x.startswith("NodeName=")]
    assert node_line == (
        "NodeName=h100-a CPUs=224 Sockets=2 CoresPerSocket=56 ThreadsPerCore=2 "
        "RealMemory=2097152 Gres=gpu:h100:8 Features=pool-train,h100,nvlink8"
    )


def test_mig_instances_are_their_own_types_over_their_caps_files(tmp_path: Path) -> None:
    nodes = nodes_from_api([api_node(inventory_of("a100-mig-8", tmp_path, "a100-m"))])
    conf = render("mixed west", nodes, Options(dev_dir="/x/dev/"))
    lines = gres_of(conf.gres, "a100-m")
    whole = [x for x in lines if "Type=a100 " in x]
    migs = [x for x in lines if "Type=a100_" in x]
    assert len(whole) == 6 and len(migs) == 4 + 7
    assert all("Links=" not in x for x in lines)  # Slurm's numbering is not PCI order here
    assert whole[0].startswith("NodeName=a100-m Name=gpu Type=a100 File=/x/dev/nvidia2 ")
    # GPU 1's instances: gi k → cap 3 + 135 + 9k, its compute instance 0 → the next.
    gi = re.findall(r"nvidia1,/x/dev/nvidia-caps/nvidia-cap(\d+),\S+cap(\d+)", "\n".join(migs))
    assert gi and all(int(ci) == int(g) + 1 for g, ci in gi)
    assert {int(g) for g, _ in gi} <= {3 + 135 + 9 * k for k in range(15)}
    node_line = next(x for x in conf.nodes.splitlines() if x.startswith("NodeName="))
    gres = re.search(r"Gres=(\S+)", node_line)
    assert gres is not None
    counts = dict(item.rsplit(":", 1) for item in gres.group(1).split(","))
    assert counts["gpu:a100"] == "6" and counts["gpu:a100_1g.10gb"] == "9"
    assert counts["gpu:a100_3g.40gb"] == "1" and counts["gpu:a100_2g.20gb"] == "1"
    assert "Features=pool-mixed-west,a100,nvlink6" in node_line


def test_pcie_gpus_have_no_links_and_no_nvlink_feature(tmp_path: Path) -> None:
    nodes = nodes_from_api([api_node(inventory_of("l40s-pcie-4", tmp_path, "l40s-1"))])
    conf = render("infer", nodes)
    lines = gres_of(conf.gres, "l40s-1")
    assert [x.split(" File=")[1].split()[0] for x in lines] == [f"/dev/nvidia{i}" for i in range(4)]
    assert all("Links=" not in x and "Type=l40s " in x for x in lines)
    assert "Features=pool-infer,l40s\n" in conf.nodes + "\n"


def test_topology_has_a_leaf_per_label_value_under_the_pool(tmp_path: Path) -> None:
    inv = [inventory_of("l40s-pcie-4", tmp_path, n) for n in ("n1", "n2", "n3", "n4")]
    racks = [{"rack": "r1"}, {"rack": "r2"}, {"rack": "r1"}, {}]
    nodes = nodes_from_api([api_node(i, r) for i, r in zip(inv, racks, strict=True)])
    conf = render("train", nodes)
    assert conf.topology.splitlines()[2:] == [
        "SwitchName=no-rack Nodes=n4",
        "SwitchName=r1 Nodes=n1,n3",
        "SwitchName=r2 Nodes=n2",
        "SwitchName=pool-train Switches=no-rack,r1,r2",
    ]
    by_switch = render("train", nodes, Options(topology_key="switch")).topology
    assert "SwitchName=no-switch Nodes=n1,n2,n3,n4" in by_switch


def test_several_pools_are_one_set_of_files_with_one_topology_root(tmp_path: Path) -> None:
    """A Slurm cluster running two pools gets every node once and one root switch (its
    tree plugin refuses two); racks hold nodes of either pool."""
    inv = [inventory_of("l40s-pcie-4", tmp_path, n) for n in ("a1", "a2", "b1")]
    racks = [{"rack": "r1"}, {"rack": "r2"}, {"rack": "r1"}]
    nodes = nodes_from_api([api_node(i, r) for i, r in zip(inv, racks, strict=True)])
    conf = render_pools([("train", nodes[:2]), ("infer", nodes[2:])])
    assert conf.topology.splitlines()[2:] == [
        "SwitchName=r1 Nodes=a1,b1",
        "SwitchName=r2 Nodes=a2",
        "SwitchName=gpufleet Switches=r1,r2",
    ]
    lines = [x for x in conf.nodes.splitlines() if x.startswith("NodeName=")]
    assert [x.split()[0] for x in lines] == ["NodeName=a1", "NodeName=a2", "NodeName=b1"]
    assert "Features=pool-infer," in lines[2] and "Features=pool-train," in lines[0]
    assert len(gres_of(conf.gres, "b1")) == 4
    with pytest.raises(SlurmConfError, match="a1 is in two"):
        render_pools([("train", nodes[:1]), ("infer", nodes[:1])])


def test_a_socket_per_gpu_gives_each_gpu_its_own_cores() -> None:
    """`--socket-per-gpu`: Sockets= the GPU count, and each GPU's Cores= a block of its
    own within its affinity's socket, all blocks disjoint and on the host's cores."""
    gpus = tuple(
        Gpu(i, "NVIDIA H100 80GB HBM3", f"0000:{i:02x}:00.0",
            cpu_affinity="0-55,112-167" if i < 4 else "56-111,168-223")
        for i in range(8)
    )  # fmt: skip
    node = Node("h", vcpu=224, memory_gib=1, gpus=gpus)
    conf = render("p", [node], Options(threads_per_core=2, socket_per_gpu=True))
    assert "CPUs=224 Sockets=8 CoresPerSocket=14 ThreadsPerCore=2 " in conf.nodes
    got = [line.split("Cores=")[1].split()[0] for line in gres_of(conf.gres, "h")]
    assert got == ["0-13", "14-27", "28-41", "42-55", "56-69", "70-83", "84-97", "98-111"]
    plain = render("p", [node], Options(threads_per_core=2))
    assert "Sockets=" not in plain.nodes and "nvidia0 Cores=0-55\n" in plain.gres
    odd = Node("o", vcpu=10, gpus=gpus[:3])  # 10 cores do not split in 3: as before
    assert "Sockets=" not in render("p", [odd], Options(socket_per_gpu=True)).nodes


def test_unreadable_gpus_and_unreported_nodes_are_left_out() -> None:
    gpus = tuple(Gpu(i, "NVIDIA H100 80GB HBM3", f"0000:0{i}:00.0") for i in range(3))
    held = (gpus[0], Gpu(1, gpus[1].name, gpus[1].pci_bus_id, missing="xid 79"), gpus[2])
    conf = render("p", [Node("a", gpus=held, vcpu=8), Node("b", reported=False)])
    assert [x.split(" File=")[1] for x in gres_of(conf.gres, "a")] == [
        "/dev/nvidia0",
        "/dev/nvidia2",
    ]
    assert "# a: GPU 1 unreadable, left out" in conf.gres
    assert "Gres=gpu:h100:2" in conf.nodes
    assert "NodeName=b" not in conf.nodes and "# b: no inventory" in conf.nodes
    assert "Nodes=a\n" in conf.topology


@pytest.mark.parametrize(
    ("name", "short"),
    [
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA GeForce RTX 4090", "rtx4090"),
        ("Tesla V100-SXM2-32GB", "v100"),
        ("NVIDIA H200 NVL", "h200"),
        ("NVIDIA", "gpu"),
    ],
)
def test_short_model_names(name: str, short: str) -> None:
    assert short_model(name) == short


def test_cores_fold_smt_siblings_and_refuse_what_does_not_fit() -> None:
    gpu = Gpu(0, "x", "0000:01:00.0", cpu_affinity="0-27,56-83")
    assert cores(gpu, 112, 1) == "0-27,56-83"
    assert cores(gpu, 112, 2) == "0-27"  # CPU 56 is core 0's second thread
    assert cores(gpu, 64, 1) is None  # CPU 83 on a 64-CPU node: the affinity is not this node's
    assert cores(Gpu(0, "x", "p"), 112, 1) is None
    two = render("p", [Node("a", vcpu=112, gpus=(gpu,))], Options(threads_per_core=2))
    assert "NodeName=a CPUs=112 ThreadsPerCore=2 Gres=gpu:x:1" in two.nodes
    assert "File=/dev/nvidia0 Cores=0-27\n" in two.gres


def test_links_count_direct_bridges_and_shared_switches() -> None:
    a, b, c = "0000:01:00.0", "0000:02:00.0", "0000:03:00.0"
    pair = [
        Gpu(0, "x", a, nvlink_peers=(b, b)),  # two bridges to GPU 1
        Gpu(1, "x", b, nvlink_peers=(a, a)),
        Gpu(2, "x", c),
    ]
    assert links(pair) == {0: "-1,2,0", 1: "2,-1,0", 2: "0,0,-1"}
    sw = ("0000:c0:00.0", "0000:c1:00.0")
    switched = [Gpu(1, "x", b, nvlink_peers=sw), Gpu(0, "x", a, nvlink_peers=sw[:1])]
    assert links(switched) == {0: "-1,1", 1: "1,-1"}  # numbered by PCI address


def test_a_malformed_answer_is_one_clear_error() -> None:
    with pytest.raises(SlurmConfError, match=r"nodes\.inventories"):
        nodes_from_api([{"nodeId": "a"}])
    with pytest.raises(SlurmConfError, match="CPU list"):
        render("p", [Node("a", vcpu=4, gpus=(Gpu(0, "x", "p", cpu_affinity="0-x"),))])


_gpu = st.builds(
    Gpu,
    index=st.integers(0, 15),
    name=st.sampled_from(["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA L40S"]),
    pci_bus_id=st.sampled_from([f"0000:{k:02x}:00.0" for k in range(16)]),
    cpu_affinity=st.sampled_from([None, "0-3", "4-7", "0-63"]),
    mig_enabled=st.booleans(),
    migs=st.lists(
        st.builds(Mig, st.sampled_from(["1g.10gb", "3g.40gb"]), st.integers(0, 14), st.just(0)),
        max_size=7,
    ).map(tuple),
    missing=st.sampled_from([None, None, "xid 79"]),
)
_node = st.builds(
    Node,
    node_id=st.from_regex(r"[a-z][a-z0-9-]{0,8}", fullmatch=True),
    labels=st.dictionaries(st.just("rack"), st.sampled_from(["r1", "r 2", "r/3"])),
    vcpu=st.sampled_from([0, 8, 64]),
    memory_gib=st.integers(0, 4096),
    gpus=st.lists(_gpu, max_size=8, unique_by=lambda g: g.index).map(tuple),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_node, max_size=6, unique_by=lambda n: n.node_id))
def test_every_node_once_and_gres_counts_match_gres_lines(nodes: list[Node]) -> None:
    conf = render("pool", nodes)
    assert render("pool", list(reversed(nodes))) == conf  # deterministic
    topo_nodes = re.findall(r"Nodes=(\S+)", conf.topology)
    listed = [n for part in topo_nodes for n in part.split(",")]
    assert sorted(listed) == sorted(n.node_id for n in nodes)
    for node in nodes:
        lines = gres_of(conf.gres, node.node_id)
        usable = [g for g in node.gpus if not g.missing]
        want = sum(len(g.migs) if g.mig_enabled else 1 for g in usable)
        assert len(lines) == want
        (line,) = [x for x in conf.nodes.splitlines() if x.startswith(f"NodeName={node.node_id} ")]
        gres = re.search(r"Gres=(\S+)", line)
        total = sum(int(x.rsplit(":", 1)[1]) for x in gres.group(1).split(",")) if gres else 0
        assert total == want
        for x in lines:
            m = re.search(r"Cores=(\S+)", x)
            if m:
                top = int(re.split(r"[-,]", m.group(1))[-1])
                assert top < node.vcpu
