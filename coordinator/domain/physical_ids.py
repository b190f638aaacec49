"""Physical identity across the fleet (issue 31, SPEC §5 "one physical device, one
promise"), pure: which of an inventory's devices are one device wherever they show
(`identities_of`), and the hold a node gets when another node already holds one
(`hold_reason`, `judged`).

Atom ids embed the node id, so the same host published under two node ids (a renamed or
reimaged host, a second agent on it) would otherwise be two nodes' worth of capacity.
The ledger keeps one holder per identity; a node whose inventory names an identity that
another node holds while that node is live or has a booking not ended is held in
provisioning until an operator says which node is real (`nodes.replace`).

Compared: GPU UUIDs (of whole GPUs, MIG parents and time-slice slots), MIG instance
UUIDs, disks by WWN or serial, and NICs by the identity the agent read from the card
(`NicInfo.physical_id`: node GUID, permanent MAC or VPD serial; agent.nic_identity),
bookable or not (the management NIC is the same host's too). Not compared: a NIC
without one (an older agent sends none; its PCI address or interface name repeats on
every host of one model) and a disk known only by its PCI path or name (the same);
placeholders of missing devices.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from coordinator.domain.transitions import MISSING_PREFIX, DuplicateDevice, NodeFlags
from shared.wire import Inventory

GPU_FORMS = frozenset({"gpu", "gpu.mig", "gpu.slot"})
# Disk ids the agent derives from the disk itself (agent.sysfs._disk_id); `path:` and
# `name:` ids name where a disk sits, not which disk it is.
DISK_IDENTITIES = ("wwn:", "serial:")
# NIC identities the agent reads from the card itself (agent.nic_identity); an `nic.vf`
# atom carries its NIC's as the attribute `physicalId`.
NIC_IDENTITIES = ("guid:", "mac:", "vpd:")
NIC_ATTR = "physicalId"
HOLD_PREFIX = "duplicateDevice"
# The hold of a node an operator said is not the real one (`nodes.replace`).
REPLACED_PREFIX = "replaced by node"
_SHOWN = 3  # devices named in a reason; the alert's details list them all


def identities_of(inv: Inventory) -> dict[str, str]:
    """identity → the device id it was read from (`gpu:<uuid>`, `mig:<uuid>`,
    `disk:<wwn or serial>`, `nic:<physical id>`), for every device that is one device
    wherever it shows."""
    out: dict[str, str] = {}
    for atom in inv.atoms:
        out |= atom_identities(atom.cls, atom.device_id, atom.attrs)
    for nic in inv.nics:
        out |= _nic_identity(nic.physical_id)
    return out


def _nic_identity(physical_id: object) -> dict[str, str]:
    if isinstance(physical_id, str) and physical_id.startswith(NIC_IDENTITIES):
        return {f"nic:{physical_id}": physical_id}
    return {}


def atom_identities(cls: str, device: str, attrs: Mapping[str, object]) -> dict[str, str]:
    """identity → device id of the devices one atom is a form of (`identities_of`)."""
    if not device or device.startswith(MISSING_PREFIX) or attrs.get("missing"):
        return {}
    if cls in GPU_FORMS:
        mig = attrs.get("uuid")
        if cls == "gpu.mig" and isinstance(mig, str) and mig:
            return {f"gpu:{device}": device, f"mig:{mig}": mig}
        return {f"gpu:{device}": device}
    if cls == "disk" and device.startswith(DISK_IDENTITIES):
        return {f"disk:{device}": device}
    if cls == "nic.vf":
        return _nic_identity(attrs.get(NIC_ATTR))
    return {}


# How a claim's device reads when it is one device wherever it shows: a GPU UUID as NVML
# writes it (MIG instances and time-slice slots claim their GPU), a disk's WWN or serial.
_PHYSICAL_DEVICES = ("GPU-", *DISK_IDENTITIES)


def is_physical_device(device: str) -> bool:
    """Does a claim on `device` compare with claims on it under any node id? (The
    database refuses two such claims of two nodes for overlapping time.)"""
    return device.startswith(_PHYSICAL_DEVICES)


@dataclass(frozen=True, slots=True)
class Collision:
    """A device of the node's inventory that `holder` holds."""

    identity: str
    device_id: str
    holder: str


def hold_reason(collisions: Iterable[Collision]) -> str:
    """Why the node is held ("" when nothing collides), naming the other nodes and the
    devices: `duplicateDevice: GPU-1, GPU-2 and 6 more held by node a`."""
    by_holder: dict[str, list[str]] = {}
    for c in sorted(collisions, key=lambda c: (c.holder, c.device_id)):
        devices = by_holder.setdefault(c.holder, [])
        if c.device_id not in devices:
            devices.append(c.device_id)
    parts = []
    for holder, devices in by_holder.items():
        shown = ", ".join(devices[:_SHOWN])
        more = f" and {len(devices) - _SHOWN} more" if len(devices) > _SHOWN else ""
        parts.append(f"{shown}{more} held by node {holder}")
    return f"{HOLD_PREFIX}: {'; '.join(parts)}" if parts else ""


def duplicate_device(
    before: NodeFlags | None, after: NodeFlags, collisions: Sequence[Collision]
) -> tuple[DuplicateDevice, ...]:
    """The transition that says a node was held for devices other nodes hold: when an
    inventory found collisions its hold did not already say (not at every inventory)."""
    was = before.duplicate_hold if before is not None else ""
    if not collisions or after.duplicate_hold == was:
        return ()
    other = tuple(sorted({c.holder for c in collisions}))
    devices = tuple(sorted({c.device_id for c in collisions}))
    return (DuplicateDevice(after.duplicate_hold, other, devices),)


def judged(flags: NodeFlags, reason: str) -> NodeFlags:
    """The flags with a duplicate-device hold `reason` ("": none) applied; provisioning
    while held, else as the agent said."""
    return replace(flags, duplicate_hold=reason, provisioning=flags.provisioning or bool(reason))


def kept(before: NodeFlags | None, found: str) -> str:
    """The hold after an inventory: the hold of a node an operator replaced stays; else
    a new collision's reason, else the hold the node had (only an operator ends it: the
    other node going quiet is no proof of which is real)."""
    was = before.duplicate_hold if before is not None else ""
    if was.startswith(REPLACED_PREFIX):
        return was
    return found or was


def replaced_reason(new_node: str) -> str:
    return f"{REPLACED_PREFIX} {new_node}"
