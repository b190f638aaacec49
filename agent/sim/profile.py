"""Host profiles: TOML descriptions of a GPU host that the simulated NVML and the fake
sysfs tree are built from (`agent/sim/profiles/*.toml`, or any file path).

A profile lists GPUs, MIG layouts, NVLink wiring, NICs, disks and node scalars. Entries
with `count = N` expand to N items and `{i}` in their name becomes 0..N-1. Loading
validates every field and names the offending key, so a typo in a profile fails at
start rather than as a strange inventory.

Beyond the hardware: `boot = true` on a disk puts the root filesystem on it, and
`management = true` on a NIC gives it the default route (neither is offered for
booking); `switchdev = true` adds a representor netdev per VF and `ipoib_children = N`
adds IPoIB child interfaces, both over the NIC's own PCI function; an `[expected]` table
(`gpu = 8`, `disk = 8` …, keyed by atom class) is the node's expected inventory.
"""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

import msgspec

from agent.errors import AgentError
from shared.wire import DEVICE_CLASSES


class ProfileError(AgentError, ValueError):
    pass


class GpuSpec(msgspec.Struct, frozen=True):
    index: int
    name: str
    memory_mib: int
    pci_bus_id: str
    numa_node: int
    compute_capability: tuple[int, int]
    nvlink_links: int
    mig_profiles: tuple[str, ...] = ()


class NicSpec(msgspec.Struct, frozen=True):
    name: str
    pci_bus_id: str
    model: str
    speed_mbps: int
    numa_node: int
    sriov_total_vfs: int
    sriov_num_vfs: int
    management: bool = False
    switchdev: bool = False
    ipoib_children: int = 0


class DiskSpec(msgspec.Struct, frozen=True):
    name: str
    size_bytes: int
    model: str
    rotational: bool
    boot: bool = False


class HostProfile(msgspec.Struct, frozen=True):
    id: str
    version: int
    description: str
    driver_version: str
    cuda_version: int
    vcpu: int
    memory_gib: int
    hugepages_1gi: int
    numa_nodes: int
    gpus: tuple[GpuSpec, ...]
    nvswitch_pci: tuple[str, ...]
    nics: tuple[NicSpec, ...]
    disks: tuple[DiskSpec, ...]
    expected: tuple[tuple[str, int], ...] = ()  # (atom class, count)
    # A socket per NUMA node, this many threads per core, numbered as Linux does: CPU c
    # is core c mod (vcpu / threads_per_core), so the first thread of every core first.
    threads_per_core: int = 1

    def socket_cpus(self, socket: int) -> list[int]:
        """The CPUs of one socket (NUMA node), every thread of its cores."""
        cores = self.vcpu // self.threads_per_core
        per = cores // self.numa_nodes
        return [t * cores + c for t in range(self.threads_per_core)
                for c in range(socket * per, (socket + 1) * per)]  # fmt: skip


def shipped_profiles() -> list[str]:
    folder = resources.files("agent.sim") / "profiles"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".toml"))


def load_profile(name_or_path: str) -> HostProfile:
    """A shipped profile by name (`h100-sxm-8`) or a profile file by path."""
    path = Path(name_or_path)
    if path.suffix == ".toml" or path.exists():
        try:
            text = path.read_text()
        except OSError as exc:
            raise ProfileError(f"cannot read profile {name_or_path}: {exc}") from exc
    else:
        if name_or_path not in shipped_profiles():
            known = ", ".join(shipped_profiles())
            raise ProfileError(f"unknown profile {name_or_path!r} (shipped: {known})")
        text = (resources.files("agent.sim") / "profiles" / f"{name_or_path}.toml").read_text()
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"profile {name_or_path}: {exc}") from exc
    return parse_profile(data)


def parse_profile(data: dict[str, Any]) -> HostProfile:
    node = _table(data, "node")
    gpu = _table(data, "gpu")
    count = _int(gpu, "gpu.count", "count", 0)
    cc = gpu.get("compute_capability", [9, 0])
    if not (isinstance(cc, list) and len(cc) == 2 and all(isinstance(x, int) for x in cc)):
        raise ProfileError("gpu.compute_capability: expected [major, minor]")
    buses = _strs(gpu, "gpu.pci_bus_ids", "pci_bus_ids", count, lambda i: f"0000:{16 + i:02x}:00.0")
    numas = _ints(gpu, "gpu.numa_nodes", "numa_nodes", count)
    migs: dict[int, tuple[str, ...]] = {}
    for k, entry in enumerate(_list(data, "mig")):
        where = f"mig[{k}]"
        index = _int(entry, f"{where}.gpu", "gpu", None)
        if not 0 <= index < count:
            raise ProfileError(f"{where}.gpu: no GPU {index}")
        profiles = entry.get("profiles")
        if not isinstance(profiles, list) or not all(isinstance(p, str) for p in profiles):
            raise ProfileError(f"{where}.profiles: expected a list of strings")
        migs[index] = tuple(profiles)
    gpus = tuple(
        GpuSpec(
            index=i,
            name=_str(gpu, "gpu.name", "name", "NVIDIA GPU"),
            memory_mib=_int(gpu, "gpu.memory_mib", "memory_mib", None),
            pci_bus_id=buses[i],
            numa_node=numas[i],
            compute_capability=(cc[0], cc[1]),
            nvlink_links=_int(gpu, "gpu.nvlink_links", "nvlink_links", 0),
            mig_profiles=migs.get(i, ()),
        )
        for i in range(count)
    )
    switches = _table(data, "nvswitch").get("pci_bus_ids", [])
    if not isinstance(switches, list) or not all(isinstance(s, str) for s in switches):
        raise ProfileError("nvswitch.pci_bus_ids: expected a list of strings")
    if any(g.nvlink_links for g in gpus) and not switches:
        raise ProfileError("nvswitch.pci_bus_ids: GPUs have NVLink but no NVSwitch is listed")
    return HostProfile(
        id=_str(data, "id", "id", None),
        version=_int(data, "version", "version", 1),
        description=_str(data, "description", "description", ""),
        driver_version=_str(data, "driver_version", "driver_version", "550.54.15"),
        cuda_version=_int(data, "cuda_version", "cuda_version", 12040),
        vcpu=_int(node, "node.vcpu", "vcpu", 0),
        memory_gib=_int(node, "node.memory_gib", "memory_gib", 0),
        hugepages_1gi=_int(node, "node.hugepages_1gi", "hugepages_1gi", 0),
        numa_nodes=max(1, _int(node, "node.numa_nodes", "numa_nodes", 1)),
        threads_per_core=max(1, _int(node, "node.threads_per_core", "threads_per_core", 1)),
        gpus=gpus,
        nvswitch_pci=tuple(switches),
        nics=tuple(_nics(data)),
        disks=tuple(_disks(data)),
        expected=_expected(data),
    )


def _expected(data: dict[str, Any]) -> tuple[tuple[str, int], ...]:
    table = _table(data, "expected")
    for key in table:
        if key not in DEVICE_CLASSES:
            raise ProfileError(f"expected.{key}: not an atom class ({', '.join(DEVICE_CLASSES)})")
    return tuple((key, _int(table, f"expected.{key}", key, None)) for key in sorted(table))


def _bool(data: dict[str, Any], where: str, key: str) -> bool:
    value = data.get(key, False)
    if not isinstance(value, bool):
        raise ProfileError(f"{where}: expected true or false")
    return value


def _nics(data: dict[str, Any]) -> list[NicSpec]:
    out: list[NicSpec] = []
    for k, entry in enumerate(_list(data, "nics")):
        where = f"nics[{k}]"
        count = _int(entry, f"{where}.count", "count", 1)
        base = 0x30 + 0x10 * k
        buses = _strs(
            entry,
            f"{where}.pci_bus_ids",
            "pci_bus_ids",
            count,
            lambda i, b=base: f"0000:{b + i:02x}:00.0",
        )
        numas = _ints(entry, f"{where}.numa_nodes", "numa_nodes", count)
        name = _str(entry, f"{where}.name", "name", None)
        total = _int(entry, f"{where}.sriov_total_vfs", "sriov_total_vfs", 0)
        num = _int(entry, f"{where}.sriov_num_vfs", "sriov_num_vfs", 0)
        if num > total:
            raise ProfileError(f"{where}.sriov_num_vfs: more than sriov_total_vfs")
        for i in range(count):
            out.append(
                NicSpec(
                    name=name.replace("{i}", str(i)),
                    pci_bus_id=buses[i],
                    model=_str(entry, f"{where}.model", "model", ""),
                    speed_mbps=_int(entry, f"{where}.speed_mbps", "speed_mbps", 0),
                    numa_node=numas[i],
                    sriov_total_vfs=total,
                    sriov_num_vfs=num,
                    management=_bool(entry, f"{where}.management", "management"),
                    switchdev=_bool(entry, f"{where}.switchdev", "switchdev"),
                    ipoib_children=_int(entry, f"{where}.ipoib_children", "ipoib_children", 0),
                )
            )
    return out


def _disks(data: dict[str, Any]) -> list[DiskSpec]:
    out: list[DiskSpec] = []
    for k, entry in enumerate(_list(data, "disks")):
        where = f"disks[{k}]"
        name = _str(entry, f"{where}.name", "name", None)
        rotational = entry.get("rotational", False)
        if not isinstance(rotational, bool):
            raise ProfileError(f"{where}.rotational: expected true or false")
        for i in range(_int(entry, f"{where}.count", "count", 1)):
            out.append(
                DiskSpec(
                    name=name.replace("{i}", str(i)),
                    size_bytes=_int(entry, f"{where}.size_bytes", "size_bytes", None),
                    model=_str(entry, f"{where}.model", "model", ""),
                    rotational=rotational,
                    boot=_bool(entry, f"{where}.boot", "boot"),
                )
            )
    return out


# -- typed access that names the key on failure -----------------------------------------


def _table(data: dict[str, Any], key: str) -> dict[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise ProfileError(f"{key}: expected a table")
    return value


def _list(data: dict[str, Any], key: str) -> list[dict[str, Any]]:
    value = data.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise ProfileError(f"{key}: expected an array of tables")
    return value


def _int(data: dict[str, Any], where: str, key: str, default: int | None) -> int:
    value = data.get(key, default)
    if value is None:
        raise ProfileError(f"{where}: required")
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ProfileError(f"{where}: expected a non-negative integer")
    return value


def _str(data: dict[str, Any], where: str, key: str, default: str | None) -> str:
    value = data.get(key, default)
    if value is None:
        raise ProfileError(f"{where}: required")
    if not isinstance(value, str):
        raise ProfileError(f"{where}: expected a string")
    return value


def _strs(data: dict[str, Any], where: str, key: str, count: int, make: Any) -> list[str]:
    value = data.get(key)
    if value is None:
        return [str(make(i)) for i in range(count)]
    if not isinstance(value, list) or len(value) != count:
        raise ProfileError(f"{where}: expected {count} strings")
    if not all(isinstance(v, str) for v in value):
        raise ProfileError(f"{where}: expected {count} strings")
    return value


def _ints(data: dict[str, Any], where: str, key: str, count: int) -> list[int]:
    value = data.get(key)
    if value is None:
        return [0] * count
    if not isinstance(value, list) or len(value) != count:
        raise ProfileError(f"{where}: expected {count} integers")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise ProfileError(f"{where}: expected {count} integers")
    return value
