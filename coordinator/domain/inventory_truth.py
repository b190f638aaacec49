"""Whether an inventory can be true of a real host (SPEC §4: an inventory never claims
what the host lacks). The wire model checks each field's form; this checks the whole:

- every atom is backed by a device the inventory lists: a `gpu` by a whole, unshared
  GPU (one atom each), a `gpu.mig` by a MIG instance of a MIG-enabled GPU, a `gpu.slot`
  by a replica of a shared GPU (at most `replicas`), a `nic.vf` by a listed VF of a NIC
  (at most `sriov_total_vfs`) or by the NIC itself when it has none, naming no NIC
  identity (`physicalId`) but that NIC's, a `disk` by a disk, and there is exactly one
  `node` atom;
- the host is within plausibility bounds (GPUs per node, memory, vCPU, hugepages).

Placeholder atoms for devices an expected inventory has and the host does not show
(`device_id` `missing:…`) stand for absence, are never allocatable, and are allowed.

An inventory that fails is refused whole, before anything of it is written: a ledger
that believed 5,000 GPUs on a host with none would promise them. Each refusal has a
`reason` from `UNTRUE_REASONS`, a bounded label for the drop counter.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Literal

from coordinator.domain.physical_ids import NIC_ATTR
from shared.wire import Inventory

# A DGX/HGX board has 8 GPUs, the largest hosts 16; a few times that is still a host.
MAX_GPUS_PER_NODE = 64
MAX_VCPU = 4096
MAX_MEMORY_GIB = 65536  # 64 TiB
PLACEHOLDER_PREFIX = "missing:"

UntrueReason = Literal["unbacked_atom", "implausible_host"]
UNTRUE_REASONS: tuple[UntrueReason, ...] = ("unbacked_atom", "implausible_host")


@dataclass(frozen=True, slots=True)
class Untrue:
    reason: UntrueReason
    message: str


def untrue(inv: Inventory) -> Untrue | None:
    """Why the inventory cannot be true of a host, or None when it can be."""
    bounds = _implausible(inv)
    if bounds is not None:
        return Untrue("implausible_host", bounds)
    unbacked = _unbacked(inv)
    if unbacked is not None:
        return Untrue("unbacked_atom", unbacked)
    return None


def _implausible(inv: Inventory) -> str | None:
    s = inv.scalars
    if len(inv.gpus) > MAX_GPUS_PER_NODE:
        return f"{len(inv.gpus)} GPUs on one node (at most {MAX_GPUS_PER_NODE})"
    if s.vcpu > MAX_VCPU:
        return f"{s.vcpu} vCPU (at most {MAX_VCPU})"
    if s.memory_gib > MAX_MEMORY_GIB:
        return f"{s.memory_gib} GiB of memory (at most {MAX_MEMORY_GIB})"
    if s.hugepages_1gi > s.memory_gib:
        return f"{s.hugepages_1gi} 1 GiB huge pages in {s.memory_gib} GiB of memory"
    return None


def _unbacked(inv: Inventory) -> str | None:
    whole = {g.uuid for g in inv.gpus if not g.mig_enabled and g.sharing == "exclusive"}
    migs = {g.uuid: {m.uuid for m in g.mig_instances} for g in inv.gpus if g.mig_enabled}
    replicas = {
        g.uuid: g.replicas for g in inv.gpus if not g.mig_enabled and g.sharing != "exclusive"
    }
    vfs = {(n.pci_address or n.name): n for n in inv.nics}
    disks = {d.device_id or d.name for d in inv.disks}
    per_device: Counter[tuple[str, str]] = Counter()
    mig_seen: set[str] = set()
    nodes = 0
    for atom in inv.atoms:
        cls, device = atom.cls, atom.device_id
        if cls == "node":
            nodes += 1
            continue
        if device.startswith(PLACEHOLDER_PREFIX):
            continue
        per_device[(cls, device)] += 1
        n = per_device[(cls, device)]
        where = f"atom {atom.atom_id}"
        if cls == "gpu":
            if device not in whole:
                return f"{where}: no whole, unshared GPU {device} in the inventory"
            if n > 1:
                return f"{where}: GPU {device} offered whole more than once"
        elif cls == "gpu.mig":
            if device not in migs:
                return f"{where}: no MIG-enabled GPU {device} in the inventory"
            uuid = str(atom.attrs.get("uuid", ""))
            if uuid not in migs[device] or uuid in mig_seen:
                return f"{where}: MIG instance {uuid or '?'} is not one of GPU {device}'s"
            mig_seen.add(uuid)
        elif cls == "gpu.slot":
            if device not in replicas:
                return f"{where}: no shared GPU {device} in the inventory"
            if n > replicas[device]:
                return f"{where}: GPU {device} has {replicas[device]} replicas"
        elif cls == "nic.vf":
            nic = vfs.get(device)
            if nic is None:
                return f"{where}: no NIC {device} in the inventory"
            limit = min(len(nic.vfs), nic.sriov_total_vfs) if nic.vfs else 1
            if n > limit:
                return f"{where}: NIC {device} backs at most {limit} (sriov_total_vfs)"
            shown = atom.attrs.get(NIC_ATTR)
            if shown not in (None, "", nic.physical_id):
                return f"{where}: NIC identity {str(shown)[:128]!r} is not NIC {device}'s"
        elif cls == "disk":
            if device not in disks:
                return f"{where}: no disk {device} in the inventory"
            if n > 1:
                return f"{where}: disk {device} offered more than once"
        else:
            return f"{where}: unknown class {cls!r}"
    if nodes != 1:
        return f"{nodes} node atoms (a host is one node)"
    return None
