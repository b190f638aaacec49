"""Reads NICs, SR-IOV VFs, local disks, vCPUs, memory and 1 GiB hugepages from sysfs and
procfs under a configurable root (`/` on a host, a fake tree in tests and simulation).

Physical NICs are the entries of `sys/class/net` whose `device` link resolves to a PCI
function (a virtio netdev's `virtio2` resolves to the PCI function above it) that is not
itself a VF (`physfn`); several netdevs over one function (switchdev representors,
IPoIB child interfaces, a second port) give one NIC, named by its primary netdev, so its
VFs are listed once. Each NIC's physical identity (IB node GUID, permanent MAC or VPD
serial: `agent.nic_identity`) names the card wherever it shows. The management NIC (the
default route's, through bonds and VLANs, or the ones configured) is marked. Disks are
`sys/block` entries except virtual ones (loop, ram, zram, dm-, md, nbd, sr, fd),
identified by WWN, serial or PCI path — never by kernel name — and the disks under /,
/boot and /boot/efi are marked as boot disks. NVIDIA GPUs on the PCI bus (vendor
0x10de, class 0x03xxxx) are listed so a GPU NVML cannot open is still counted. Anything
unreadable is left out and named in `problems`, never raised. `read_ports` is the cheap
per-poll part: link state of each NIC.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from agent.nic_identity import nic_identity
from agent.pci_ids import nic_model
from agent.readings import DiskReading, HostReading, NicReading

_VIRTUAL_DISK = re.compile(r"^(loop|ram|zram|dm-|md|nbd|sr|fd)\d*")
_VIRTFN = re.compile(r"^virtfn(\d+)$")
_PCI_ADDRESS = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_REPRESENTOR = re.compile(r"^(pf\d+vf\d+|pf\d+sf\d+|c\d+pf\d+vf\d+|pf\d+)$")
_BOOT_MOUNTS = ("/", "/boot", "/boot/efi")
_IB_ACTIVE = "ACTIVE"


def read_host(root: Path, management_nics: tuple[str, ...] = ()) -> HostReading:
    """`management_nics` names the management NICs; empty: the default route's."""
    problems: list[str] = []
    mgmt = set(management_nics) or _default_route_nics(root)
    return HostReading(
        vcpu=_vcpus(root, problems),
        cpu_topology=cpu_topology(root),
        memory_bytes=_meminfo_kib(root, "MemTotal", problems) * 1024,
        hugepages_1gi=_int_file(
            root / "sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages", 0
        ),
        nics=tuple(_nics(root, problems, mgmt)),
        disks=tuple(_disks(root, problems)),
        gpu_pci=_gpu_pci(root),
        problems=tuple(problems),
    )


def read_ports(root: Path, nics: tuple[NicReading, ...]) -> dict[str, tuple[str, ...]]:
    """Per NIC device id (PCI address, else name): why its link is down, empty when up.

    `operstate` down or lowerlayerdown is down (`unknown` is what many drivers say for a
    working link, so it is not); an InfiniBand port under the same PCI function in any
    state but ACTIVE is down (INIT/ARMED: no subnet manager has configured it yet).
    """
    # Plain string paths every poll: pathlib interns each name it parses, and interned
    # names made and dropped every poll grow CPython's table of them (~0.5 MB of the
    # agent's steady memory, bench/agent_bench.py).
    ib = _ib_ports(os.path.join(root, "sys/class/infiniband"))
    net = os.path.join(root, "sys/class/net")
    out: dict[str, tuple[str, ...]] = {}
    for nic in nics:
        why: list[str] = []
        state = _read(os.path.join(net, nic.name, "operstate"))
        if state in ("down", "lowerlayerdown"):
            why.append(f"{nic.name}: link {state}")
        for port, text in ib.get(nic.pci_address or "", ()):
            if _IB_ACTIVE not in text.upper():
                why.append(f"{port}: InfiniBand port {text}")
        out[nic.pci_address or nic.name] = tuple(why)
    return out


def _ib_ports(base: str) -> dict[str, list[tuple[str, str]]]:
    try:
        devices = sorted(os.listdir(base))
    except OSError:
        return {}
    out: dict[str, list[tuple[str, str]]] = {}
    for dev in devices:
        pci = _pci_function(os.path.join(base, dev, "device"))
        try:
            ports = sorted(os.listdir(os.path.join(base, dev, "ports")))
        except OSError:
            continue
        for port in ports:
            state = _read(os.path.join(base, dev, "ports", port, "state"))
            if pci and state is not None:
                out.setdefault(pci, []).append((f"{dev}/{port}", state))
    return out


def _ib_guids(base: str) -> dict[str, str]:
    """PCI function → the `node_guid` of the InfiniBand/RoCE device on it (the first by
    name where a function has several)."""
    try:
        devices = sorted(os.listdir(base))
    except OSError:
        return {}
    out: dict[str, str] = {}
    for dev in devices:
        pci = _pci_function(os.path.join(base, dev, "device"))
        guid = _read(os.path.join(base, dev, "node_guid"))
        if pci and guid is not None:
            out.setdefault(pci, guid)
    return out


def _pci_function(device: str | Path) -> str | None:
    """The PCI address a `device` link resolves to, or the nearest PCI function above it
    (virtio: `.../0000:00:03.0/virtio2` → `0000:00:03.0`)."""
    if not os.path.exists(device):
        return None
    path = os.path.realpath(device)
    while path and path != os.path.dirname(path):
        name = os.path.basename(path)
        if _PCI_ADDRESS.match(name):
            return name
        path = os.path.dirname(path)
    return None


def _gpu_pci(root: Path) -> tuple[str, ...]:
    base = root / "sys/bus/pci/devices"
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return ()
    out = []
    for name in names:
        vendor = (_read(base / name / "vendor") or "").lower()
        cls = (_read(base / name / "class") or "").lower().removeprefix("0x")
        # 0x0300 VGA and 0x0302 3D controllers; NVSwitches (0x0680) and audio functions
        # of the same vendor are not GPUs.
        if vendor == "0x10de" and cls.startswith("03"):
            out.append(name)
    return tuple(out)


def _default_route_nics(root: Path) -> set[str]:
    names: set[str] = set()
    route = _read(root / "proc/net/route") or ""
    for line in route.splitlines()[1:]:
        parts = line.split()
        if len(parts) > 2 and parts[1] == "00000000" and parts[7:8] == ["00000000"]:
            names.add(parts[0])
    route6 = _read(root / "proc/net/ipv6_route") or ""
    for line in route6.splitlines():
        parts = line.split()
        if len(parts) == 10 and parts[0] == "0" * 32 and parts[1] == "00" and parts[9] != "lo":
            names.add(parts[9])
    return _lower_devices(root, names)


def _lower_devices(root: Path, names: set[str]) -> set[str]:
    """A bond, bridge or VLAN and everything under it (`lower_*` links), so the physical
    NIC that carries the management traffic is found."""
    out: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name in out:
            continue
        out.add(name)
        try:
            entries = os.listdir(root / "sys/class/net" / name)
        except OSError:
            continue
        todo += [e.removeprefix("lower_") for e in entries if e.startswith("lower_")]
    return out


def _read(path: str | Path) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
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


def _cpu_list(text: str) -> list[int]:
    out: list[int] = []
    for part in text.strip().split(","):
        lo, _, hi = part.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return out


def cpu_topology(root: Path) -> tuple[int, int, int] | None:
    """(sockets, cores per socket, threads per core) of the online CPUs, from each
    one's `topology/physical_package_id` and `core_id`; None when unreadable or uneven
    (Slurm's node line cannot say it then)."""
    online = _read(root / "sys/devices/system/cpu/online")
    try:
        cpus = _cpu_list(online) if online else []
    except ValueError:
        return None
    cores: set[tuple[int, int]] = set()
    for cpu in cpus:
        where = root / f"sys/devices/system/cpu/cpu{cpu}/topology"
        package, core = (
            _int_file(where / "physical_package_id", -1),
            _int_file(where / "core_id", -1),
        )
        if package < 0 or core < 0:
            return None
        cores.add((package, core))
    sockets = len({p for p, _ in cores})
    if not cores or len(cpus) % len(cores) or len(cores) % sockets:
        return None
    return sockets, len(cores) // sockets, len(cpus) // len(cores)


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


def _nics(root: Path, problems: list[str], mgmt: set[str]) -> list[NicReading]:
    net = root / "sys/class/net"
    try:
        names = sorted(os.listdir(net))
    except OSError:
        problems.append("nic: sys/class/net unreadable")
        return []
    by_pci: dict[str, list[str]] = {}
    for name in names:
        device = net / name / "device"
        pci = _pci_function(device)
        if pci is None or (root / "sys/bus/pci/devices" / pci / "physfn").exists():
            continue  # virtual interfaces and VFs are not NICs we offer
        if (device / "physfn").exists():
            continue
        by_pci.setdefault(pci, []).append(name)
    guids = _ib_guids(os.path.join(root, "sys/class/infiniband"))
    out: list[NicReading] = []
    for pci, netdevs in sorted(by_pci.items()):
        name = min(netdevs, key=lambda n: _primary_rank(net / n, n))
        device = net / name / "device"
        speed = _int_file(net / name / "speed", -1)
        numa = _int_file(device / "numa_node", -1)
        function = root / "sys/bus/pci/devices" / pci
        if not function.exists():
            function = Path(os.path.realpath(device))
        vfs: list[tuple[int, str]] = []
        try:
            entries = os.listdir(function)
        except OSError:
            entries = []
        for entry in entries:
            match = _VIRTFN.match(entry)
            if match:
                vfs.append(
                    (int(match.group(1)), os.path.basename(os.path.realpath(function / entry)))
                )
        physical_id, why = nic_identity(str(net / name), str(function), guids.get(pci))
        if not physical_id:
            problems.append(f"nic {name}: no physical identity, not compared: {why}")
        out.append(
            NicReading(
                name=name,
                pci_address=pci,
                speed_mbps=speed if speed > 0 else None,
                numa_node=numa if numa >= 0 else None,
                model=nic_model(_read(function / "vendor"), _read(function / "device")),
                sriov_total_vfs=_int_file(function / "sriov_totalvfs", 0),
                sriov_num_vfs=_int_file(function / "sriov_numvfs", 0),
                vfs=tuple(vf for _, vf in sorted(vfs)),
                management=bool(mgmt & set(netdevs)),
                physical_id=physical_id,
            )
        )
    return sorted(out, key=lambda n: n.name)


def _primary_rank(netdev: Path, name: str) -> tuple[int, int, str]:
    """Order netdevs of one PCI function: the uplink first, then by port; switchdev
    representors (`phys_port_name` pf0vf3…) and IPoIB child interfaces (`ib0.8001`, with
    a `parent` file) last."""
    port_name = _read(netdev / "phys_port_name") or ""
    secondary = bool(_REPRESENTOR.match(port_name)) or (netdev / "parent").exists() or "." in name
    return (int(secondary), _int_file(netdev / "dev_port", 0), name)


def _disks(root: Path, problems: list[str]) -> list[DiskReading]:
    block = root / "sys/block"
    try:
        names = sorted(os.listdir(block))
    except OSError:
        problems.append("disk: sys/block unreadable")
        return []
    boot = _boot_disks(root)
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
                device_id=_disk_id(root, name),
                boot=name in boot,
            )
        )
    return out


def _disk_id(root: Path, name: str) -> str:
    """WWN (`wwid`, `device/wwid`), else serial (+ namespace), else the PCI path: the
    same disk keeps its id across reboots and re-enumeration."""
    base = root / "sys/block" / name
    for path in (base / "wwid", base / "device/wwid"):
        text = _read(path)
        if text:
            return f"wwn:{'_'.join(text.split())}"
    serial = _read(base / "device/serial") or _read(base / "serial")
    if serial:
        nsid = _read(base / "nsid")
        return f"serial:{'_'.join(serial.split())}" + (f":ns{nsid}" if nsid else "")
    parts = os.path.realpath(base).split(os.sep)
    first = next((i for i, p in enumerate(parts) if _PCI_ADDRESS.match(p)), None)
    if first is not None:
        end = parts.index("block", first) if "block" in parts[first:] else len(parts) - 1
        return "path:" + "/".join(parts[first:end])
    return f"name:{name}"  # no stable identity to be found (virtual hardware)


def _boot_disks(root: Path) -> set[str]:
    """Whole disks under /, /boot and /boot/efi: mountinfo's major:minor (or the mount
    source) → sys/dev/block → partition's parent, or a device mapper/md's slaves."""
    text = _read(root / "proc/self/mountinfo") or ""
    found: set[str] = set()
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 10 or fields[4] not in _BOOT_MOUNTS:
            continue
        dash = fields.index("-") if "-" in fields else -1
        source = fields[dash + 2] if 0 < dash < len(fields) - 2 else ""
        node = root / "sys/dev/block" / fields[2]
        if fields[2].startswith("0:") or not node.exists():
            node = root / "sys/class/block" / os.path.basename(source)
        found |= _whole_disks(Path(os.path.realpath(node)))
    return found


def _whole_disks(dev: Path, depth: int = 0) -> set[str]:
    if depth > 8 or not dev.exists():
        return set()
    if (dev / "partition").exists():
        return {dev.parent.name}
    try:
        slaves = os.listdir(dev / "slaves")
    except OSError:
        slaves = []
    if slaves:
        out: set[str] = set()
        for slave in slaves:
            out |= _whole_disks(Path(os.path.realpath(dev / "slaves" / slave)), depth + 1)
        return out
    return {dev.name}
