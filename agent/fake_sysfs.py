"""Builds a fake sysfs/procfs tree from a host profile, for tests and simulate mode.

The tree has the shapes `agent.sysfs` reads on a real host: `sys/class/net/<nic>/device`
links into `sys/bus/pci/devices`, `virtfn<N>` and `physfn` links for SR-IOV, VF netdevs,
`sys/block` with sector counts (plus a loop and a ram device that must be ignored),
`sys/devices/system/cpu/online`, `proc/meminfo` and the 1 GiB hugepage count.
"""

from __future__ import annotations

import os
from pathlib import Path

from agent.pci_ids import pci_id_for
from agent.profile import HostProfile, NicSpec


def vf_address(pf: str, k: int) -> str:
    """VF k of a PF at `dddd:bb:00.0`: functions 1.. on the same bus, 8 per device."""
    domain, bus, _ = pf.split(":")
    n = k + 1
    return f"{domain}:{bus}:{n // 8:02x}.{n % 8}"


def build_tree(root: Path, profile: HostProfile) -> Path:
    _write(root / "sys/devices/system/cpu/online", f"0-{max(profile.vcpu, 1) - 1}")
    kib = profile.memory_gib * 1024 * 1024
    _write(root / "proc/meminfo", f"MemTotal: {kib} kB\nMemFree: {kib // 2} kB\n")
    hp = root / "sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages"
    _write(hp, str(profile.hugepages_1gi))
    _write(root / "sys/class/net/lo/operstate", "unknown")  # no device link: skipped
    for nic in profile.nics:
        _nic(root, nic)
    for disk in profile.disks:
        base = root / "sys/block" / disk.name
        _write(base / "size", str(disk.size_bytes // 512))
        _write(base / "queue/rotational", "1" if disk.rotational else "0")
        _write(base / "device/model", disk.model)
    _write(root / "sys/block/loop0/size", "2097152")
    _write(root / "sys/block/ram0/size", "131072")
    return root


def _nic(root: Path, nic: NicSpec) -> None:
    pci = root / "sys/bus/pci/devices"
    vendor, device = pci_id_for(nic.model).split(":")
    pf = pci / nic.pci_bus_id
    _write(pf / "vendor", f"0x{vendor}")
    _write(pf / "device", f"0x{device}")
    _write(pf / "numa_node", str(nic.numa_node))
    if nic.sriov_total_vfs:
        _write(pf / "sriov_totalvfs", str(nic.sriov_total_vfs))
        _write(pf / "sriov_numvfs", str(nic.sriov_num_vfs))
    netdev = root / "sys/class/net" / nic.name
    _write(netdev / "speed", str(nic.speed_mbps))
    _link(netdev / "device", pf)
    for k in range(nic.sriov_num_vfs):
        address = vf_address(nic.pci_bus_id, k)
        vf = pci / address
        _write(vf / "vendor", f"0x{vendor}")
        _link(vf / "physfn", pf)
        _link(pf / f"virtfn{k}", vf)
        # VFs have netdevs of their own on a host; they must not count as NICs.
        vf_netdev = root / "sys/class/net" / f"{nic.name}v{k}"
        _write(vf_netdev / "speed", str(nic.speed_mbps))
        _link(vf_netdev / "device", vf)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def _link(link: Path, target: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.is_symlink():
        os.symlink(os.path.relpath(target, link.parent), link)
