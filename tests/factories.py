"""Hand-built wire values for coordinator tests (the agent has its own simulated hosts)."""

from __future__ import annotations

import hashlib
from copy import copy as shallow_copy
from typing import Any, TypeVar

import msgspec

from shared.wire import (
    Atom,
    DeviceHealth,
    DeviceUse,
    DiskInfo,
    GpuInfo,
    Heartbeat,
    Inventory,
    MigInstance,
    NicInfo,
    NodeHealth,
    Scalars,
)

W = TypeVar("W", bound=msgspec.Struct)


def unchecked(value: W, **changes: Any) -> W:
    """A copy of `value` with `changes`, past the model's own rules (`__post_init__`):
    what an agent that does not use the model could send, for the ledger's defences."""
    copy = shallow_copy(value)  # no __post_init__: `value` may be unchecked already
    for name, changed in changes.items():
        msgspec.structs.force_setattr(copy, name, changed)
    return copy


def make_inventory(
    node_id: str,
    pool_id: str,
    *,
    gpus: int = 8,
    mig: int = 0,
    nics: int = 0,
    disks: int = 0,
    vcpu: int = 64,
    memory_gib: int = 512,
    hugepages: int = 0,
    health: str = "healthy",
    devices: tuple[DeviceHealth, ...] = (),
    provisioning: bool = False,
    labels: dict[str, str] | None = None,
    boot_id: str = "boot-1",
    sent_at: int = 0,
) -> Inventory:
    atoms = [Atom(atom_id=f"{node_id}:node", cls="node", device_id="")]
    for i in range(gpus):
        uuid = f"GPU-{node_id}-{i}"
        atoms.append(
            Atom(
                atom_id=f"{node_id}:gpu:{uuid}",
                cls="gpu",
                device_id=uuid,
                attrs={
                    "model": "NVIDIA H100 80GB HBM3",
                    "index": i,
                    "nvlinkClique": f"{node_id}:nvl",
                },
            )
        )
    for i in range(mig):
        atoms.append(
            Atom(
                atom_id=f"{node_id}:gpu.mig:MIG-{i}",
                cls="gpu.mig",
                device_id=f"GPU-{node_id}-mig",
                # MIG UUIDs are as unique as GPU UUIDs: the ledger compares them fleet-wide.
                attrs={"profile": "3g.40gb", "uuid": f"MIG-{node_id}-{i}"},
            )
        )
    for i in range(nics):
        atoms.append(Atom(atom_id=f"{node_id}:nic.vf:{i}", cls="nic.vf", device_id=f"nic{i}"))
    for i in range(disks):
        atoms.append(Atom(atom_id=f"{node_id}:disk:nvme{i}", cls="disk", device_id=f"nvme{i}"))
    digest = hashlib.sha256(
        "|".join(a.atom_id for a in atoms).encode() + f"{vcpu}/{memory_gib}".encode()
    ).hexdigest()
    return backed(
        Inventory(
            node_id=node_id,
            pool_id=pool_id,
            boot_id=boot_id,
            sent_at=sent_at,
            inventory_hash=digest,
            hostname=node_id,
            labels=labels or {},
            provisioning=provisioning,
            scalars=Scalars(vcpu=vcpu, memory_gib=memory_gib, hugepages_1gi=hugepages),
            atoms=tuple(atoms),
            health=NodeHealth(status=health),  # type: ignore[arg-type]
            devices=devices,
        )
    )


def renamed(inv: Inventory, node_id: str, **changes: Any) -> Inventory:
    """The same host's inventory published under another node id (a renamed or reimaged
    host, a second agent on it): the same physical devices, atom ids of `node_id`."""
    own = f"{inv.node_id}:"
    atoms = tuple(
        msgspec.structs.replace(a, atom_id=f"{node_id}:{a.atom_id.removeprefix(own)}")
        for a in inv.atoms
    )
    fields: dict[str, Any] = {"node_id": node_id, "hostname": node_id, "atoms": atoms}
    return msgspec.structs.replace(inv, **(fields | changes))


def backed(inv: Inventory) -> Inventory:
    """`inv` with its device lists made to match its atoms, as an agent would list them,
    for tests that hand-build atoms (the ledger refuses atoms no listed device backs)."""
    forms: dict[str, list[Atom]] = {}
    for atom in inv.atoms:
        if atom.cls != "node":
            forms.setdefault(f"{atom.cls}|{atom.device_id}", []).append(atom)
    gpus: list[GpuInfo] = [g for g in inv.gpus if g.missing]
    nics: list[NicInfo] = []
    disks: list[DiskInfo] = []
    for key, atoms in forms.items():
        cls, device = key.split("|", 1)
        if cls == "gpu" and device not in {g.uuid for g in gpus}:
            gpus.append(_gpu(device, len(gpus)))
        elif cls == "gpu.mig":
            instances = tuple(
                MigInstance(uuid=str(a.attrs.get("uuid", "")), gpu_instance_id=k,
                            compute_instance_id=0, profile="3g.40gb", memory_mib=40_000)
                for k, a in enumerate(atoms)
            )  # fmt: skip
            gpus.append(_gpu(device, len(gpus), mig_enabled=True, mig_instances=instances))
        elif cls == "gpu.slot":
            gpus.append(_gpu(device, len(gpus), sharing="timeslice", replicas=len(atoms)))
        elif cls == "nic.vf":
            vfs = tuple(a.atom_id for a in atoms) if len(atoms) > 1 else ()
            nics.append(NicInfo(name=device, sriov_total_vfs=len(vfs), vfs=vfs))
        elif cls == "disk":
            disks.append(DiskInfo(name=device, size_bytes=1 << 40))
    return unchecked(inv, gpus=tuple(gpus), nics=tuple(nics), disks=tuple(disks))


def _gpu(uuid: str, index: int, **kw: object) -> GpuInfo:
    return GpuInfo(
        uuid=uuid,
        index=index,
        name="NVIDIA H100 80GB HBM3",
        memory_mib=81559,
        pci_bus_id=f"0000:{index:02x}:00.0",
        **kw,  # type: ignore[arg-type]
    )


def make_heartbeat(
    inv: Inventory,
    seq: int = 1,
    *,
    health: str = "healthy",
    devices: tuple[DeviceHealth, ...] = (),
    interval_ms: int = 1000,
    inventory_hash: str | None = None,
    provisioning: bool = False,
    boot_id: str | None = None,
    use: tuple[DeviceUse, ...] = (),
    use_base: int = 0,
    use_version: int = 0,
) -> Heartbeat:
    return Heartbeat(
        node_id=inv.node_id,
        pool_id=inv.pool_id,
        boot_id=boot_id if boot_id is not None else inv.boot_id,
        seq=seq,
        sent_at=0,
        interval_ms=interval_ms,
        inventory_hash=inventory_hash if inventory_hash is not None else inv.inventory_hash,
        provisioning=provisioning,
        health=NodeHealth(status=health),  # type: ignore[arg-type]
        devices=devices,
        use=use,
        use_base=use_base,
        use_version=use_version,
    )
