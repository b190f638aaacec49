"""Pure: readings → the wire `Inventory` (GPUs, NICs, disks, scalars, atoms, hash).

Atom ids are `<nodeId>:<class>:<stable device key>` — a GPU or MIG UUID, a PCI address,
a disk's WWN/serial/PCI path — so they are unique per node and survive reboots and agent
restarts; a duplicate is dropped (and logged) rather than sent, and the wire model
refuses one. Each atom's `device_id` is the device whose health moves it (a MIG instance
or a time-slice replica moves with its physical GPU). A GPU NVML cannot read keeps its
atoms (placeholder ids `missing-…` before its first good read). The boot disk and the
management NIC are listed but get no atom unless `offer_boot_disks` /
`offer_management_nics`. An expected inventory (atom class → count) that the host falls
short of gets placeholder atoms (`missing:<class>:<k>`, attribute `missing`) so the
shortfall shows as unhealthy capacity instead of silently smaller capacity. The inventory
hash covers everything except what changes on every send (`sentAt`, `bootId`) and
health, which travels in heartbeats.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Mapping

import msgspec

from agent.readings import DiskReading, GpuReading, HostReading, NicReading, NvmlSnapshot
from shared.cliques import bits, clique_partition, peer_sets
from shared.wire import (
    ATOM_CLASSES,
    Atom,
    AttrValue,
    CpuTopology,
    DeviceHealth,
    DiskInfo,
    GpuInfo,
    Inventory,
    MigInstance,
    NicInfo,
    NodeHealth,
    Scalars,
    Sharing,
)

GIB = 1024**3
MISSING_PREFIX = "missing-"
log = logging.getLogger(__name__)
_HASH_EXCLUDE = ("sentAt", "bootId", "inventoryHash", "health", "devices")


class SharingRule(msgspec.Struct, frozen=True):
    """GPUs (by UUID, index, or `all`) offered as `replicas` time-slice or MPS slots."""

    gpus: tuple[str, ...]
    mode: Sharing
    replicas: int

    def matches(self, gpu: GpuReading) -> bool:
        return "all" in self.gpus or gpu.uuid in self.gpus or str(gpu.index) in self.gpus


class Identity(msgspec.Struct, frozen=True):
    node_id: str
    pool_id: str
    hostname: str = ""
    agent_version: str = ""
    profile_id: str | None = None
    profile_version: int | None = None
    labels: tuple[tuple[str, str], ...] = ()
    provisioning: bool = False


def nvlink_cliques(gpus: Iterable[GpuReading]) -> dict[str, str]:
    """GPU UUID → clique name: GPUs with one name share an NVLink pairwise, directly or
    through one NVSwitch fabric (SPEC §5: a chain of bridges is not a clique).

    The node's GPUs are split into cliques from the link matrix, the largest first
    (`clique_partition`), named `nvl0`, `nvl1`… in that order. GPUs without an active
    link get no clique.
    """
    linked = [g for g in sorted(gpus, key=lambda g: g.index) if g.nvlink_remotes]
    peers = peer_sets((g.uuid, g.pci_bus_id or g.uuid, g.nvlink_remotes) for g in linked)
    at = {g.uuid: i for i, g in enumerate(linked)}
    adjacency = [sum(1 << at[p] for p in peers[g.uuid] if p in at) for g in linked]
    out: dict[str, str] = {}
    for n, part in enumerate(clique_partition(adjacency)):
        for i in bits(part):
            out[linked[i].uuid] = f"nvl{n}"
    return out


def _gpu_info(gpu: GpuReading, clique: str | None, rule: SharingRule | None) -> GpuInfo:
    shared = rule is not None and not gpu.mig_enabled
    return GpuInfo(
        uuid=gpu.uuid,
        index=gpu.index,
        name=gpu.name,
        memory_mib=gpu.memory_mib,
        pci_bus_id=gpu.pci_bus_id,
        numa_node=gpu.numa_node,
        cpu_affinity=gpu.cpu_affinity,
        compute_capability=gpu.compute_capability,
        mig_enabled=gpu.mig_enabled,
        mig_instances=tuple(
            MigInstance(
                uuid=m.uuid,
                gpu_instance_id=m.gpu_instance_id,
                compute_instance_id=m.compute_instance_id,
                profile=m.profile,
                memory_mib=m.memory_mib,
            )
            for m in gpu.migs
        ),
        nvlink_peers=gpu.nvlink_remotes,
        nvlink_clique=clique,
        fabric_clique=gpu.fabric_clique,
        sharing=rule.mode if shared and rule is not None else "exclusive",
        replicas=rule.replicas if shared and rule is not None else 1,
        # A GPU read before keeps its inventory (its state travels as health); only a
        # stand-in for one never read says so here, as it has nothing else to say.
        missing=gpu.missing if gpu.uuid.startswith(MISSING_PREFIX) else None,
    )


def _topology(layout: tuple[int, int, int] | None) -> CpuTopology | None:
    if layout is None:
        return None
    sockets, cores, threads = layout
    return CpuTopology(sockets=sockets, cores_per_socket=cores, threads_per_core=threads)


def _gpu_atoms(node_id: str, gpu: GpuInfo) -> list[Atom]:
    base: dict[str, AttrValue] = {
        "model": gpu.name,
        "gpuUuid": gpu.uuid,
        "gpuIndex": gpu.index,
        "pciBusId": gpu.pci_bus_id,
        "numaNode": gpu.numa_node,
        "nvlinkClique": gpu.nvlink_clique,
        "fabricClique": gpu.fabric_clique,
        "computeCapability": gpu.compute_capability,
    }
    if gpu.missing:
        base["missing"] = gpu.missing
    if gpu.mig_enabled:
        return [
            Atom(
                atom_id=f"{node_id}:gpu.mig:{m.uuid}",
                cls="gpu.mig",
                device_id=gpu.uuid,
                attrs={
                    **base,
                    "uuid": m.uuid,
                    "profile": m.profile,
                    "memoryMiB": m.memory_mib,
                    "gpuInstanceId": m.gpu_instance_id,
                    "computeInstanceId": m.compute_instance_id,
                },
            )
            for m in gpu.mig_instances
        ]
    attrs: dict[str, AttrValue] = {**base, "uuid": gpu.uuid, "memoryMiB": gpu.memory_mib}
    if gpu.sharing == "exclusive":
        return [
            Atom(atom_id=f"{node_id}:gpu:{gpu.uuid}", cls="gpu", device_id=gpu.uuid, attrs=attrs)
        ]
    return [
        Atom(
            atom_id=f"{node_id}:gpu.slot:{gpu.uuid}:{k}",
            cls="gpu.slot",
            device_id=gpu.uuid,
            attrs={**attrs, "sharing": gpu.sharing, "replica": k, "replicas": gpu.replicas},
        )
        for k in range(gpu.replicas)
    ]


def _nic_atoms(node_id: str, nic: NicReading) -> list[Atom]:
    device = nic.pci_address or nic.name
    attrs: dict[str, AttrValue] = {
        "nic": nic.name,
        "model": nic.model,
        "speedMbps": nic.speed_mbps,
        "numaNode": nic.numa_node,
        "pfPciAddress": nic.pci_address,
        # The card's own identity, compared fleet-wide by the coordinator (issue 31).
        "physicalId": nic.physical_id or None,
    }
    if nic.sriov_num_vfs == 0 or not nic.vfs:
        whole = {**attrs, "pciAddress": nic.pci_address, "sriov": False}
        return [
            Atom(atom_id=f"{node_id}:nic:{device}", cls="nic.vf", device_id=device, attrs=whole)
        ]
    return [
        Atom(
            atom_id=f"{node_id}:nic.vf:{vf}",
            cls="nic.vf",
            device_id=device,
            attrs={**attrs, "pciAddress": vf, "vfIndex": k, "sriov": True},
        )
        for k, vf in enumerate(nic.vfs)
    ]


def _disk_atom(node_id: str, disk: DiskReading) -> Atom:
    key = disk.device_id or disk.name
    attrs: dict[str, AttrValue] = {
        "name": disk.name,
        "sizeBytes": disk.size_bytes,
        "sizeGiB": disk.size_bytes // GIB,
        "rotational": disk.rotational,
        "model": disk.model,
    }
    return Atom(atom_id=f"{node_id}:disk:{key}", cls="disk", device_id=key, attrs=attrs)


def shortfall_atoms(
    node_id: str, atoms: Iterable[Atom], gpus: int, expected: Mapping[str, int]
) -> list[Atom]:
    """Placeholder atoms for what the expected inventory has and the host does not show.
    `gpu` counts physical GPUs (whole, MIG or shared; missing GPUs already have atoms)."""
    have: dict[str, int] = {}
    for atom in atoms:
        have[atom.cls] = have.get(atom.cls, 0) + 1
    have["gpu"] = gpus
    out: list[Atom] = []
    for cls, want in sorted(expected.items()):
        if cls == "gpu" or cls not in ATOM_CLASSES or cls == "node":
            continue
        found = have.get(cls, 0)
        for k in range(found, want):
            why = f"expected {want} {cls}, found {found}"
            out.append(
                Atom(
                    atom_id=f"{node_id}:{cls}:missing-{k}",
                    cls=cls,
                    device_id=f"missing:{cls}:{k}",
                    attrs={"missing": why},
                )
            )
    return out


def _unique(atoms: list[Atom]) -> list[Atom]:
    seen: set[str] = set()
    out: list[Atom] = []
    for atom in atoms:
        if atom.atom_id in seen:
            log.warning("inventory: duplicate atom id %s left out", atom.atom_id)
            continue
        seen.add(atom.atom_id)
        out.append(atom)
    return out


def _derived_labels(gpus: tuple[GpuInfo, ...]) -> dict[str, str]:
    labels: dict[str, str] = {"gpu.count": str(len(gpus))}
    models = {g.name for g in gpus}
    if len(models) == 1:
        labels["gpu.model"] = models.pop()
    cliques = {g.nvlink_clique for g in gpus if g.nvlink_clique}
    labels["nvlink.cliques"] = str(len(cliques))
    fabric = {g.fabric_clique for g in gpus if g.fabric_clique}
    if len(fabric) == 1:
        labels["nvlink.fabric"] = fabric.pop()
    return labels


def build_inventory(
    ident: Identity,
    nvml: NvmlSnapshot,
    host: HostReading,
    sharing: tuple[SharingRule, ...] = (),
    *,
    boot_id: str,
    sent_at: int,
    health: NodeHealth | None = None,
    devices: tuple[DeviceHealth, ...] = (),
    offer_boot_disks: bool = False,
    offer_management_nics: bool = False,
    expected: Mapping[str, int] | None = None,
) -> Inventory:
    cliques = nvlink_cliques(nvml.gpus)
    nics = _one_per_function(host.nics)
    gpus = tuple(
        _gpu_info(g, cliques.get(g.uuid), next((r for r in sharing if r.matches(g)), None))
        for g in sorted(nvml.gpus, key=lambda g: g.index)
    )
    scalars = Scalars(
        vcpu=host.vcpu, memory_gib=host.memory_bytes // GIB, hugepages_1gi=host.hugepages_1gi
    )
    labels = {**_derived_labels(gpus), **dict(ident.labels)}
    node_attrs: dict[str, AttrValue] = {
        "hostname": ident.hostname,
        "gpuModel": labels.get("gpu.model"),
        "gpuCount": len(gpus),
        "vcpu": scalars.vcpu,
        "memoryGiB": scalars.memory_gib,
        "profileId": ident.profile_id,
    }
    atoms = [Atom(atom_id=f"{ident.node_id}:node", cls="node", attrs=node_attrs)]
    for gpu in gpus:
        atoms += _gpu_atoms(ident.node_id, gpu)
    for nic in nics:
        if offer_management_nics or not nic.management:
            atoms += _nic_atoms(ident.node_id, nic)
    for disk in host.disks:
        if offer_boot_disks or not disk.boot:
            atoms.append(_disk_atom(ident.node_id, disk))
    atoms = _unique(atoms)
    if expected:
        atoms += shortfall_atoms(ident.node_id, atoms, len(gpus), expected)
    inv = Inventory(
        node_id=ident.node_id,
        pool_id=ident.pool_id,
        boot_id=boot_id,
        sent_at=sent_at,
        inventory_hash="",
        hostname=ident.hostname,
        agent_version=ident.agent_version,
        driver_version=nvml.driver_version,
        cuda_version=nvml.cuda_version,
        profile_id=ident.profile_id,
        profile_version=ident.profile_version,
        labels=labels,
        provisioning=ident.provisioning,
        gpus=gpus,
        nics=tuple(
            NicInfo(
                name=n.name,
                pci_address=n.pci_address,
                speed_mbps=n.speed_mbps,
                sriov_total_vfs=n.sriov_total_vfs,
                sriov_num_vfs=n.sriov_num_vfs,
                vfs=n.vfs,
                physical_id=n.physical_id,
                bookable=offer_management_nics or not n.management,
            )
            for n in nics
        ),
        disks=tuple(
            DiskInfo(
                name=d.name,
                size_bytes=d.size_bytes,
                rotational=d.rotational,
                model=d.model,
                device_id=d.device_id,
                bookable=offer_boot_disks or not d.boot,
            )
            for d in host.disks
        ),
        scalars=scalars,
        cpu_topology=_topology(host.cpu_topology),
        atoms=tuple(atoms),
        health=health or NodeHealth(status="healthy"),
        devices=devices,
    )
    return msgspec.structs.replace(inv, inventory_hash=inventory_hash(inv))


def _one_per_function(nics: Iterable[NicReading]) -> list[NicReading]:
    """The sysfs reader already gives one NIC per PCI function; hand-made readings may
    not, and two NICs listing the same VFs would give duplicate atoms."""
    seen: set[str] = set()
    out: list[NicReading] = []
    for nic in nics:
        key = nic.pci_address or nic.name
        if key not in seen:
            seen.add(key)
            out.append(nic)
    return out


def inventory_hash(inv: Inventory) -> str:
    """sha256 of the canonical JSON of the inventory without per-send fields and health."""
    body = msgspec.to_builtins(inv)
    for name in _HASH_EXCLUDE:
        del body[name]
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()
