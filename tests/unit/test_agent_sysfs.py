"""sysfs/procfs reading over fake trees: NICs, VFs, disks, CPUs, memory, hugepages."""

from __future__ import annotations

import os
from pathlib import Path

from agent.fake_sysfs import build_tree, vf_address
from agent.profile import load_profile
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
