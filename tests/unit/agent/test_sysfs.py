"""sysfs/procfs reading over fake trees: NICs, VFs, disks, CPUs, memory, hugepages."""

from __future__ import annotations

import os
from pathlib import Path

from agent.sim.profile import load_profile
from agent.sim.sysfs_tree import build_tree, vf_address
from agent.sysfs import read_host


def test_h100_tree(tmp_path: Path) -> None:
    host = read_host(build_tree(tmp_path, load_profile("h100-sxm-8")))
    assert host.problems == ()
    assert host.vcpu == 224
    assert host.memory_bytes == 2048 * 1024**3
    assert host.hugepages_1gi == 512
    names = [n.name for n in host.nics]
    assert names == ["eno1"] + [f"ibp{i}s0" for i in range(8)]  # no lo, no VF netdevs
    ib0 = host.nics[1]
    assert ib0.pci_address == "0000:1a:00.0"
    assert ib0.sriov_total_vfs == 16 and ib0.sriov_num_vfs == 4
    assert ib0.vfs == tuple(vf_address("0000:1a:00.0", k) for k in range(4))
    assert ib0.numa_node == 0 and ib0.speed_mbps == 400000 and ib0.model == "ConnectX-7"
    assert host.nics[0].vfs == () and host.nics[0].model == "E810-C"
    disks = [d.name for d in host.disks]
    assert disks == [f"nvme{i}n1" for i in range(8)] + ["sda"]  # loop0 and ram0 skipped
    assert host.disks[0].size_bytes == 3840755982336 and not host.disks[0].rotational


def test_vf_addresses_roll_over_device_numbers() -> None:
    assert vf_address("0000:1a:00.0", 0) == "0000:1a:00.1"
    assert vf_address("0000:1a:00.0", 6) == "0000:1a:00.7"
    assert vf_address("0000:1a:00.0", 7) == "0000:1a:01.0"


def test_vfs_sorted_numerically(tmp_path: Path) -> None:
    pf = tmp_path / "sys/bus/pci/devices/0000:01:00.0"
    pf.mkdir(parents=True)
    (pf / "sriov_numvfs").write_text("12\n")
    (pf / "sriov_totalvfs").write_text("16\n")
    for k in range(12):
        vf = tmp_path / f"sys/bus/pci/devices/0000:01:{k // 8:02x}.{k % 8 + 1}"
        vf.mkdir(parents=True, exist_ok=True)
        os.symlink(vf, pf / f"virtfn{k}")
    net = tmp_path / "sys/class/net/eth0"
    net.mkdir(parents=True)
    os.symlink(pf, net / "device")
    (nic,) = read_host(tmp_path).nics
    assert nic.vfs[9] == "0000:01:01.2"  # virtfn9, not virtfn1 after virtfn10's string order
    assert nic.speed_mbps is None and nic.numa_node is None and nic.model is None


def test_missing_tree_reports_problems_not_errors(tmp_path: Path) -> None:
    host = read_host(tmp_path)
    assert host.vcpu == 0 and host.nics == () and host.disks == ()
    assert any("cpu" in p for p in host.problems)
    assert any("meminfo" in p for p in host.problems)
    assert any("sys/class/net" in p for p in host.problems)


def test_cpu_list_with_gaps(tmp_path: Path) -> None:
    cpu = tmp_path / "sys/devices/system/cpu"
    cpu.mkdir(parents=True)
    (cpu / "online").write_text("0-3,8-11,16\n")
    assert read_host(tmp_path).vcpu == 9


def test_disks_skip_virtual_and_empty(tmp_path: Path) -> None:
    for name, size in [("zram0", 8), ("dm-0", 8), ("md0", 8), ("nbd0", 8), ("sr0", 8)]:
        d = tmp_path / "sys/block" / name
        d.mkdir(parents=True)
        (d / "size").write_text(f"{size}\n")
    empty = tmp_path / "sys/block/sdb"
    empty.mkdir(parents=True)
    (empty / "size").write_text("0\n")
    spinning = tmp_path / "sys/block/sdc"
    (spinning / "queue").mkdir(parents=True)
    (spinning / "size").write_text("1000\n")
    (spinning / "queue/rotational").write_text("1\n")
    disks = read_host(tmp_path).disks
    assert [(d.name, d.size_bytes, d.rotational) for d in disks] == [("sdc", 512000, True)]


def _mk(path: Path, text: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")
    return path


def _ln(link: Path, target: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    target.mkdir(parents=True, exist_ok=True)
    os.symlink(target, link)


def test_netdevs_sharing_a_function_are_one_nic(tmp_path: Path) -> None:
    # l40s: switchdev representors; h100: IPoIB child interfaces, over the PF's function.
    l40s = read_host(build_tree(tmp_path / "a", load_profile("l40s-pcie-4")))
    assert [(n.name, len(n.vfs)) for n in l40s.nics] == [("ens0f0", 2), ("ens1f0", 2)]
    assert (tmp_path / "a/sys/class/net/ens0f0_1/phys_port_name").exists()
    h100 = read_host(build_tree(tmp_path / "b", load_profile("h100-sxm-8")))
    assert [n.name for n in h100.nics] == ["eno1"] + [f"ibp{i}s0" for i in range(8)]
    assert (tmp_path / "b/sys/class/net/ibp0s0.8001/parent").exists()


def test_virtio_netdev_resolves_to_its_pci_function(tmp_path: Path) -> None:
    fn = tmp_path / "sys/devices/pci0000:00/0000:00:03.0"
    _mk(fn / "vendor", "0x1af4")
    _ln(tmp_path / "sys/class/net/ens3/device", fn / "virtio2")
    (nic,) = read_host(tmp_path).nics
    assert nic.pci_address == "0000:00:03.0"


def test_disk_ids_are_stable_not_kernel_names(tmp_path: Path) -> None:
    host = read_host(build_tree(tmp_path / "t", load_profile("h100-sxm-8")))
    assert all(d.device_id.startswith("wwn:") for d in host.disks)
    # Serial only (with namespace), then PCI path only.
    nvme = tmp_path / "sys/block/nvme0n1"
    _mk(nvme / "size", "100")
    _mk(nvme / "device/serial", "S64FNE0R123456")
    _mk(nvme / "nsid", "2")
    real = tmp_path / "sys/devices/pci0000:00/0000:00:17.0/ata1/host0/target0:0:0/0:0:0:0/block/sdb"
    _mk(real / "size", "100")
    _ln(tmp_path / "sys/block/sdb", real)
    ids = {d.name: d.device_id for d in read_host(tmp_path).disks}
    assert ids["nvme0n1"] == "serial:S64FNE0R123456:ns2"
    assert ids["sdb"] == "path:0000:00:17.0/ata1/host0/target0:0:0/0:0:0:0"


def test_boot_disk_through_device_mapper(tmp_path: Path) -> None:
    for name in ("nvme0n1", "nvme1n1"):
        _mk(tmp_path / f"sys/block/{name}/size", "100")
        _mk(tmp_path / f"sys/block/{name}/{name}p1/partition", "1")
    dm = tmp_path / "sys/block/dm-0"
    _mk(dm / "size", "100")
    _ln(dm / "slaves/nvme1n1p1", tmp_path / "sys/block/nvme1n1/nvme1n1p1")
    _ln(tmp_path / "sys/dev/block/253:0", dm)
    _mk(tmp_path / "proc/self/mountinfo", "1 0 253:0 / / rw - xfs /dev/mapper/vg-root rw")
    boot = {d.name: d.boot for d in read_host(tmp_path).disks}
    assert boot == {"nvme0n1": False, "nvme1n1": True}


def test_management_nic_behind_a_bond_and_by_configuration(tmp_path: Path) -> None:
    for name, fn in (("eno1", "0000:4b:00.0"), ("eno2", "0000:4b:00.1")):
        _ln(tmp_path / f"sys/class/net/{name}/device", tmp_path / f"sys/bus/pci/devices/{fn}")
    _ln(tmp_path / "sys/class/net/bond0/lower_eno2", tmp_path / "sys/class/net/eno2")
    _mk(
        tmp_path / "proc/net/route",
        "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\n"
        "bond0\t00000000\t0100000A\t0003\t0\t0\t0\t00000000",
    )
    assert [(n.name, n.management) for n in read_host(tmp_path).nics] == [
        ("eno1", False),
        ("eno2", True),
    ]
    configured = read_host(tmp_path, management_nics=("eno1",)).nics
    assert [(n.name, n.management) for n in configured] == [("eno1", True), ("eno2", False)]


def test_gpus_on_the_pci_bus_exclude_nvswitches(tmp_path: Path) -> None:
    host = read_host(build_tree(tmp_path, load_profile("h100-sxm-8")))
    assert len(host.gpu_pci) == 8 and "0000:05:00.0" not in host.gpu_pci


def test_cpu_topology_from_sysfs(tmp_path: Path) -> None:
    """Sockets, cores per socket and threads per core as `slurmd -C` reports them, from
    each online CPU's package and core ids; an uneven or unreadable layout is None."""
    assert read_host(build_tree(tmp_path / "h", load_profile("h100-sxm-8"))).cpu_topology == (
        2, 56, 2,
    )  # fmt: skip
    assert read_host(build_tree(tmp_path / "l", load_profile("l40s-pcie-4"))).cpu_topology == (
        1, 32, 2,
    )  # fmt: skip
    cpu = tmp_path / "odd/sys/devices/system/cpu"
    cpu.mkdir(parents=True)
    (cpu / "online").write_text("0-2\n")
    for n, (package, core) in enumerate([(0, 0), (0, 1), (1, 0)]):
        (cpu / f"cpu{n}/topology").mkdir(parents=True)
        (cpu / f"cpu{n}/topology/physical_package_id").write_text(f"{package}\n")
        (cpu / f"cpu{n}/topology/core_id").write_text(f"{core}\n")
    assert read_host(tmp_path / "odd").cpu_topology is None  # 2 + 1 cores: uneven
    assert read_host(tmp_path / "missing").cpu_topology is None
