"""Builds a fake sysfs/procfs tree from a host profile, for tests and simulate mode.

The tree has the shapes `agent.sysfs` reads on a real host: `sys/class/net/<nic>/device`
links into `sys/bus/pci/devices`, `virtfn<N>` and `physfn` links for SR-IOV, VF netdevs,
`sys/block` with sector counts (plus a loop and a ram device that must be ignored),
`sys/devices/system/cpu/online`, `proc/meminfo` and the 1 GiB hugepage count; NVIDIA
GPUs and NVSwitches as PCI functions (class 0x0302 / 0x0680); `operstate` and, for
InfiniBand NICs (`ib…`), `sys/class/infiniband/mlx5_N/ports/1/state`; switchdev
representors and IPoIB children over the PF; each NIC's identities (permanent MAC, the
InfiniBand node GUID, a VPD serial: `vpd_image`); disk WWIDs and serials; the boot disk's
partition in `proc/self/mountinfo` and the management NIC's default route in
`proc/net/route`; a fresh kernel boot id (`proc/sys/kernel/random/boot_id`) per tree, as
after a reboot. `FaultedPorts` applies `port_down` faults to the tree.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Callable
from pathlib import Path

from agent.pci_ids import pci_id_for
from agent.readings import NicReading
from agent.sim.faults import FaultFile
from agent.sim.profile import DiskSpec, HostProfile, NicSpec
from agent.sysfs import read_ports


def vf_address(pf: str, k: int) -> str:
    """VF k of a PF at `dddd:bb:00.0`: functions 1.. on the same bus, 8 per device."""
    domain, bus, _ = pf.split(":")
    n = k + 1
    return f"{domain}:{bus}:{n // 8:02x}.{n % 8}"


def vpd_image(serial: str, name: str = "Simulated NIC") -> bytes:
    """PCI Vital Product Data as a card's firmware writes it: the identifier string, a
    read-only resource with part number, serial (`SN`) and checksum (`RV`), the end tag."""

    def keyword(key: bytes, value: bytes) -> bytes:
        return key + bytes([len(value)]) + value

    def large(tag: int, body: bytes) -> bytes:
        return bytes([tag, len(body) & 0xFF, len(body) >> 8]) + body

    fields = keyword(b"PN", b"MCX75310AAS-NEAT") + keyword(b"SN", serial.encode())
    read_only = len(fields) + 4  # and RV: its key, its length and the checksum byte
    head = large(0x82, name.encode()) + bytes([0x90, read_only & 0xFF, read_only >> 8])
    upto = head + fields + b"RV\x01"
    checksum = -sum(upto) & 0xFF  # every byte from the start through RV sums to zero
    return upto + bytes([checksum, 0x78])


def build_tree(root: Path, profile: HostProfile, host: str = "") -> Path:
    """The tree of `profile`. `host` (the node id) seeds disk WWIDs and serials and the
    NICs' MACs, GUIDs and serials: like GPU UUIDs, they are one device's wherever it
    shows, so two simulated hosts differ."""
    _write(root / "sys/devices/system/cpu/online", f"0-{max(profile.vcpu, 1) - 1}")
    for socket in range(profile.numa_nodes):
        for cpu in profile.socket_cpus(socket):
            topology = root / f"sys/devices/system/cpu/cpu{cpu}/topology"
            _write(topology / "physical_package_id", str(socket))
            _write(topology / "core_id", str(cpu % (profile.vcpu // profile.threads_per_core)))
    _write(root / "proc/sys/kernel/random/boot_id", str(uuid.uuid4()))
    kib = profile.memory_gib * 1024 * 1024
    _write(root / "proc/meminfo", f"MemTotal: {kib} kB\nMemFree: {kib // 2} kB\n")
    hp = root / "sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages"
    _write(hp, str(profile.hugepages_1gi))
    _write(root / "sys/class/net/lo/operstate", "unknown")  # no device link: skipped
    pci = root / "sys/bus/pci/devices"
    for gpu in profile.gpus:
        _write(pci / gpu.pci_bus_id / "vendor", "0x10de")
        _write(pci / gpu.pci_bus_id / "class", "0x030200")
    for switch in profile.nvswitch_pci:
        _write(pci / switch / "vendor", "0x10de")
        _write(pci / switch / "class", "0x068000")
    routes = ["Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask"]
    ib = 0
    for nic in profile.nics:
        _nic(root, nic, ib, host)
        ib += nic.name.startswith("ib")
        if nic.management:
            routes.append(f"{nic.name}\t00000000\t0100000A\t0003\t0\t0\t0\t00000000")
    _write(root / "proc/net/route", "\n".join(routes))
    mounts: list[str] = []
    for k, disk in enumerate(profile.disks):
        _disk(root, disk, k, mounts, host)
    _write(root / "proc/self/mountinfo", "\n".join(mounts))
    _write(root / "sys/block/loop0/size", "2097152")
    _write(root / "sys/block/ram0/size", "131072")
    return root


def _disk(root: Path, disk: DiskSpec, k: int, mounts: list[str], host: str) -> None:
    base = root / "sys/block" / disk.name
    _write(base / "size", str(disk.size_bytes // 512))
    _write(base / "queue/rotational", "1" if disk.rotational else "0")
    _write(base / "device/model", disk.model)
    seed = f"{host}/{disk.model}/{disk.name}" if host else f"{disk.model}/{disk.name}"
    digest = hashlib.sha256(seed.encode()).hexdigest()
    if disk.name.startswith("nvme"):
        _write(base / "wwid", f"eui.{digest[:16]}")
        _write(base / "device/serial", digest[16:30].upper())
        _write(base / "nsid", "1")
    else:
        _write(base / "device/wwid", f"naa.5{digest[:15]}")
    if disk.boot:
        part = f"{disk.name}p2" if disk.name[-1].isdigit() else f"{disk.name}2"
        _write(base / part / "partition", "2")
        _write(base / part / "size", str(disk.size_bytes // 1024))
        major = 259 if disk.name.startswith("nvme") else 8
        _link(root / "sys/class/block" / part, base / part)
        _link(root / "sys/dev/block" / f"{major}:{k * 16 + 2}", base / part)
        mounts.append(
            f"{29 + k} 1 {major}:{k * 16 + 2} / / rw,relatime shared:1 - ext4 /dev/{part} rw"
        )


class FaultedPorts:
    """Per-poll NIC link states for simulate mode: writes each `port_down` fault into the
    fake tree (operstate, InfiniBand port state) when the fault file changes, then reads
    the tree like `agent.sysfs.read_ports` does on a host."""

    def __init__(self, root: Path, faults: FaultFile) -> None:
        self._root = root
        self._faults = faults
        self._applied: frozenset[str] | None = None

    def __call__(self, nics: tuple[NicReading, ...]) -> dict[str, tuple[str, ...]]:
        down = frozenset(f.nic for f in self._faults.current().on("port_down"))
        if down != self._applied:
            self._applied = down
            for nic in nics:
                _set_port(self._root, nic.name, up=nic.name not in down)
        return read_ports(self._root, nics)


def port_reader(
    root: Path, faults: FaultFile
) -> Callable[[tuple[NicReading, ...]], dict[str, tuple[str, ...]]]:
    return FaultedPorts(root, faults)


def _set_port(root: Path, name: str, up: bool) -> None:
    net = root / "sys/class/net" / name
    if not net.exists():
        return
    _write(net / "operstate", "up" if up else "down")
    marker = net / "ib_device"
    if marker.exists():
        dev = marker.read_text().strip()
        state = "4: ACTIVE" if up else "1: DOWN"
        _write(root / "sys/class/infiniband" / dev / "ports/1/state", state)


def _nic(root: Path, nic: NicSpec, ib: int, host: str) -> None:
    pci = root / "sys/bus/pci/devices"
    vendor, device = pci_id_for(nic.model).split(":")
    pf = pci / nic.pci_bus_id
    seed = f"{host}/{nic.pci_bus_id}" if host else nic.pci_bus_id
    digest = hashlib.sha256(seed.encode()).hexdigest()
    _write(pf / "vendor", f"0x{vendor}")
    (pf / "vpd").write_bytes(vpd_image(f"MT{digest[:10].upper()}", nic.model))
    _write(pf / "device", f"0x{device}")
    _write(pf / "numa_node", str(nic.numa_node))
    if nic.sriov_total_vfs:
        _write(pf / "sriov_totalvfs", str(nic.sriov_total_vfs))
        _write(pf / "sriov_numvfs", str(nic.sriov_num_vfs))
    netdev = root / "sys/class/net" / nic.name
    _write(netdev / "speed", str(nic.speed_mbps))
    _write(netdev / "operstate", "up")
    _link(netdev / "device", pf)
    mac = ":".join(["b8", "ce", "f6", digest[10:12], digest[12:14], digest[14:16]])
    _write(netdev / "addr_assign_type", "0")
    if nic.name.startswith("ib"):
        dev = f"mlx5_{ib}"
        # IPoIB: 20 octets, the queue pair number first; not a card's identity.
        _write(netdev / "address", f"00:00:10:49:fe:80:00:00:00:00:00:00:{mac}:00:01")
        _write(netdev / "ib_device", dev)  # the fake tree's own note, for FaultedPorts
        _write(root / "sys/class/infiniband" / dev / "ports/1/state", "4: ACTIVE")
        guid = f"a088:c203:00{digest[16:18]}:{digest[18:22]}"
        _write(root / "sys/class/infiniband" / dev / "node_guid", guid)
        _link(root / "sys/class/infiniband" / dev / "device", pf)
    else:
        _write(netdev / "address", mac)
    for c in range(nic.ipoib_children):
        child = root / "sys/class/net" / f"{nic.name}.{0x8001 + c:04x}"
        _write(child / "parent", nic.name)
        _write(child / "operstate", "up")
        _link(child / "device", pf)
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
        if nic.switchdev:
            # The VF's representor on the host side: its device link is the PF's function.
            rep = root / "sys/class/net" / f"{nic.name}_{k}"
            _write(rep / "phys_port_name", f"pf0vf{k}")
            _write(rep / "operstate", "up")
            _link(rep / "device", pf)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def _link(link: Path, target: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.is_symlink():
        os.symlink(os.path.relpath(target, link.parent), link)
