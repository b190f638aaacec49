"""Simulated hosts for the ledger simulation: what an agent would report as its devices
change form, fail, disappear and come back, or as it is restarted into another pool.

Atom ids follow the agent (`agent/inventory.py`): a whole GPU `<node>:gpu:<uuid>`, MIG
instances by their own UUIDs (new ones at every re-partition), time-slice slots
`<node>:gpu.slot:<uuid>:<k>` (the same ids come back when the replica count does), a
NIC without VFs `<node>:nic:<pci>` (`sriov: false`), VFs by their PCI address, a disk
by its WWN and the node itself.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal

from shared.wire import (
    Atom,
    AttrValue,
    DeviceHealth,
    DiskInfo,
    GpuInfo,
    Heartbeat,
    Inventory,
    MigInstance,
    NicInfo,
    NodeHealth,
    Scalars,
)

GpuMode = Literal["whole", "mig", "slot"]
# The GPUs' NVLink bridges: every pair (`all`), or each to the next by index (`chain`:
# 0–1–2 is two cliques, {0,1} and {1,2}, never one).
Links = Literal["all", "chain"]
Health = Literal["healthy", "degraded", "unhealthy", "unmonitored"]


@dataclass
class SimGpu:
    uuid: str
    mode: GpuMode = "whole"
    parts: int = 1  # MIG instances or time-slice replicas
    generation: int = 0  # bumped at every MIG re-partition: new instance UUIDs
    present: bool = True  # False: gone from the inventory (the agent lost it)
    health: Health = "healthy"


def _gpu_pci(i: int) -> str:
    return f"0000:{0x10 + i:02x}:00.0"


def _mig(g: SimGpu, k: int) -> str:
    return f"MIG-{g.uuid}-{g.generation}-{k}"


def _mig_profile(g: SimGpu) -> str:
    return "3g.40gb" if g.parts == 2 else "2g.20gb"


@dataclass
class SimNic:
    pci: str
    vfs: int = 0  # 0: booked whole
    present: bool = True
    health: Health = "healthy"


@dataclass
class SimHost:
    node_id: str
    pool_id: str  # the pool the agent is configured with
    rack: str
    gpus: list[SimGpu]
    nics: list[SimNic]
    disk: str
    vcpu: int = 16
    memory_gib: int = 64
    health: Health = "healthy"
    provisioning: bool = False
    boot: int = 1
    seq: int = 0
    links: Links = "all"

    @classmethod
    def build(
        cls, node_id: str, pool_id: str, rack: str, gpus: int, nics: int, links: Links = "all"
    ) -> SimHost:
        return cls(
            node_id=node_id,
            pool_id=pool_id,
            rack=rack,
            gpus=[SimGpu(f"GPU-{node_id}-{i}") for i in range(gpus)],
            nics=[SimNic(f"0000:{0x40 + i:02x}:00.0") for i in range(nics)],
            disk=f"wwn-{node_id}",
            links=links,
        )

    def _linked(self, i: int, j: int) -> bool:
        return i != j and (self.links == "all" or abs(i - j) == 1)

    def _peers(self, i: int) -> tuple[str, ...]:
        """The PCI addresses at the far end of GPU i's active links: present GPUs only (a
        lost GPU's links are down)."""
        return tuple(
            _gpu_pci(j) for j, g in enumerate(self.gpus) if g.present and self._linked(i, j)
        )

    def _clique_label(self, i: int) -> str:
        """The agent's label: a clique of the link matrix ({0,1}, {2,3}… on a chain)."""
        return f"{self.node_id}:nvl" if self.links == "all" else f"{self.node_id}:nvl{i // 2}"

    def form(self, dev: SimGpu | SimNic) -> tuple[dict[str, object], int]:
        """A create's device entry for one of the device's current forms, pinned to it by
        a selector, and how many forms it has."""
        if isinstance(dev, SimNic):
            entry: dict[str, object] = {"class": "nic.vf", "selector": {"pfPciAddress": dev.pci}}
            return entry, max(dev.vfs, 1)
        cls = {"whole": "gpu", "mig": "gpu.mig", "slot": "gpu.slot"}[dev.mode]
        return {"class": cls, "selector": {"gpuUuid": dev.uuid}}, dev.parts

    def atoms(self) -> list[Atom]:
        n = self.node_id
        out = [Atom(atom_id=f"{n}:node", cls="node")]
        for i, g in enumerate(self.gpus):
            if not g.present:
                continue
            base: dict[str, AttrValue] = {
                "model": "H100",
                "gpuUuid": g.uuid,
                "nvlinkClique": self._clique_label(i),
            }
            if g.mode == "whole":
                out.append(
                    Atom(atom_id=f"{n}:gpu:{g.uuid}", cls="gpu", device_id=g.uuid, attrs=base)
                )
            elif g.mode == "mig":
                out += [
                    Atom(
                        atom_id=f"{n}:gpu.mig:{_mig(g, k)}",
                        cls="gpu.mig",
                        device_id=g.uuid,
                        attrs={**base, "uuid": _mig(g, k), "profile": _mig_profile(g)},
                    )
                    for k in range(g.parts)
                ]
            else:
                out += [
                    Atom(
                        atom_id=f"{n}:gpu.slot:{g.uuid}:{k}",
                        cls="gpu.slot",
                        device_id=g.uuid,
                        attrs={**base, "sharing": "timeslice", "replica": k, "replicas": g.parts},
                    )
                    for k in range(g.parts)
                ]
        for nic in self.nics:
            if not nic.present:
                continue
            if nic.vfs == 0:
                out.append(
                    Atom(
                        atom_id=f"{n}:nic:{nic.pci}",
                        cls="nic.vf",
                        device_id=nic.pci,
                        attrs={"sriov": False, "pfPciAddress": nic.pci},
                    )
                )
            else:
                out += [
                    Atom(
                        atom_id=f"{n}:nic.vf:{nic.pci}.{k + 1}",
                        cls="nic.vf",
                        device_id=nic.pci,
                        attrs={"sriov": True, "vfIndex": k, "pfPciAddress": nic.pci},
                    )
                    for k in range(nic.vfs)
                ]
        out.append(Atom(atom_id=f"{n}:disk:{self.disk}", cls="disk", device_id=self.disk))
        return out

    def device_health(self) -> tuple[DeviceHealth, ...]:
        """Every present device that is not healthy (as heartbeats list them)."""
        sick: list[DeviceHealth] = [
            DeviceHealth(device_id=g.uuid, status=g.health, reasons=("simulated",))
            for g in self.gpus
            if g.present and g.health != "healthy"
        ]
        sick += [
            DeviceHealth(device_id=nic.pci, status=nic.health, reasons=("simulated",))
            for nic in self.nics
            if nic.present and nic.health != "healthy"
        ]
        return tuple(sick)

    def devices(self) -> tuple[tuple[GpuInfo, ...], tuple[NicInfo, ...], tuple[DiskInfo, ...]]:
        """The devices behind the atoms, as the agent lists them."""
        gpus = tuple(
            GpuInfo(
                uuid=g.uuid,
                index=i,
                name="H100",
                memory_mib=81559,
                pci_bus_id=_gpu_pci(i),
                nvlink_peers=self._peers(i),
                nvlink_clique=self._clique_label(i),
                mig_enabled=g.mode == "mig",
                mig_instances=tuple(
                    MigInstance(
                        uuid=_mig(g, k),
                        gpu_instance_id=k,
                        compute_instance_id=0,
                        profile=_mig_profile(g),
                        memory_mib=20_000,
                    )
                    for k in range(g.parts if g.mode == "mig" else 0)
                ),
                sharing="timeslice" if g.mode == "slot" else "exclusive",
                replicas=g.parts if g.mode == "slot" else 1,
            )
            for i, g in enumerate(self.gpus)
            if g.present
        )
        nics = tuple(
            NicInfo(
                name=f"eth{i}",
                pci_address=nic.pci,
                sriov_total_vfs=8,
                sriov_num_vfs=nic.vfs,
                vfs=tuple(f"{nic.pci}.{k + 1}" for k in range(nic.vfs)),
            )
            for i, nic in enumerate(self.nics)
            if nic.present
        )
        return gpus, nics, (DiskInfo(name="nvme0n1", size_bytes=1 << 40, device_id=self.disk),)

    def inventory(self, now: int) -> Inventory:
        atoms = self.atoms()
        gpus, nics, disks = self.devices()
        digest = hashlib.sha256(
            "|".join(f"{a.atom_id}/{a.device_id}" for a in atoms).encode()
            + f"{self.pool_id}/{self.vcpu}/{self.memory_gib}".encode()
        ).hexdigest()
        return Inventory(
            node_id=self.node_id,
            pool_id=self.pool_id,
            boot_id=f"boot-{self.boot}",
            sent_at=now,
            inventory_hash=digest,
            hostname=self.node_id,
            labels={"rack": self.rack},
            provisioning=self.provisioning,
            scalars=Scalars(vcpu=self.vcpu, memory_gib=self.memory_gib),
            gpus=gpus,
            nics=nics,
            disks=disks,
            atoms=tuple(atoms),
            health=NodeHealth(status=self.health),
            devices=self.device_health(),
        )

    def heartbeat(self, now: int) -> Heartbeat:
        self.seq += 1
        return Heartbeat(
            node_id=self.node_id,
            pool_id=self.pool_id,
            boot_id=f"boot-{self.boot}",
            seq=self.seq,
            sent_at=now,
            interval_ms=5000,
            inventory_hash=self.inventory(now).inventory_hash,
            provisioning=self.provisioning,
            health=NodeHealth(status=self.health),
            devices=self.device_health(),
        )
