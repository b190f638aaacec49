"""Reads NICs, SR-IOV VFs, local disks, vCPUs, memory and 1 GiB hugepages from sysfs and
procfs under a configurable root (`/` on a host, a fake tree in tests and simulation).

Physical NICs are the entries of `sys/class/net` whose `device` link points at a PCI
function that is not itself a VF (`physfn`). Disks are `sys/block` entries except
virtual ones (loop, ram, zram, dm-, md, nbd, sr, fd). Anything unreadable is left out
and named in `problems`, never raised.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from agent.pci_ids import nic_model
from agent.readings import DiskReading, HostReading, NicReading

_VIRTUAL_DISK = re.compile(r"^(loop|ram|zram|dm-|md|nbd|sr|fd)\d*")
_VIRTFN = re.compile(r"^virtfn(\d+)$")


def read_host(root: Path) -> HostReading:
    problems: list[str] = []
    return HostReading(
        vcpu=_vcpus(root, problems),
        memory_bytes=_meminfo_kib(root, "MemTotal", problems) * 1024,
        hugepages_1gi=_int_file(
            root / "sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages", 0
        ),
        nics=tuple(_nics(root, problems)),
        disks=tuple(_disks(root, problems)),
        problems=tuple(problems),
    )


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _int_file(path: Path, default: int) -> int:
    text = _read(path)
    try:
        return int(text) if text is not None else default
    except ValueError:
        return default


def _vcpus(root: Path, problems: list[str]) -> int:
    text = _read(root / "sys/devices/system/cpu/online")
    if text is None:
        problems.append("cpu: sys/devices/system/cpu/online unreadable")
        return 0
    total = 0
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        try:
            total += int(hi or lo) - int(lo) + 1
        except ValueError:
            problems.append(f"cpu: bad cpu list {text!r}")
            return 0
    return total


def _meminfo_kib(root: Path, key: str, problems: list[str]) -> int:
    text = _read(root / "proc/meminfo")
    if text is None:
        problems.append("memory: proc/meminfo unreadable")
        return 0
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name == key:
            try:
                return int(rest.split()[0])
            except (IndexError, ValueError):
                break
    problems.append(f"memory: no {key} in proc/meminfo")
    return 0


def _nics(root: Path, problems: list[str]) -> list[NicReading]:
    net = root / "sys/class/net"
    try:
        names = sorted(os.listdir(net))
    except OSError:
        problems.append("nic: sys/class/net unreadable")
        return []
    out: list[NicReading] = []
    for name in names:
        device = net / name / "device"
        if not device.exists() or (device / "physfn").exists():
            continue  # virtual interfaces and VFs are not NICs we offer
        pci = os.path.basename(os.path.realpath(device))
        speed = _int_file(net / name / "speed", -1)
        numa = _int_file(device / "numa_node", -1)
        vfs: list[tuple[int, str]] = []
        try:
            entries = os.listdir(device)
        except OSError:
            entries = []
        for entry in entries:
            match = _VIRTFN.match(entry)
            if match:
                vfs.append(
                    (int(match.group(1)), os.path.basename(os.path.realpath(device / entry)))
                )
        out.append(
            NicReading(
                name=name,
                pci_address=pci or None,
                speed_mbps=speed if speed > 0 else None,
                numa_node=numa if numa >= 0 else None,
                model=nic_model(_read(device / "vendor"), _read(device / "device")),
                sriov_total_vfs=_int_file(device / "sriov_totalvfs", 0),
                sriov_num_vfs=_int_file(device / "sriov_numvfs", 0),
                vfs=tuple(vf for _, vf in sorted(vfs)),
            )
        )
    return out


def _disks(root: Path, problems: list[str]) -> list[DiskReading]:
    block = root / "sys/block"
    try:
        names = sorted(os.listdir(block))
    except OSError:
        problems.append("disk: sys/block unreadable")
        return []
    out: list[DiskReading] = []
    for name in names:
        if _VIRTUAL_DISK.match(name):
            continue
        sectors = _int_file(block / name / "size", 0)
        if sectors <= 0:
            continue  # empty card readers and the like
        out.append(
            DiskReading(
                name=name,
                size_bytes=sectors * 512,  # sysfs counts 512-byte sectors whatever the disk
                rotational=_int_file(block / name / "queue/rotational", 0) == 1,
                model=_read(block / name / "device/model"),
            )
        )
    return out
