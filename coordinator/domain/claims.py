"""Claims on physical devices: what a booking of one atom really promises, and when two
such promises collide (SPEC §5 "One physical device, one promise").

An atom is one form of a physical device: a whole GPU, one of its MIG instances or
time-slice slots (device: the GPU UUID), a NIC or one of its VFs (device: the NIC),
a disk (itself), or the whole node. Booking the atom claims either the whole device or
one part of its current partition. Claims are compared within one node.

Two claims conflict when their times overlap and they are on the same device and either
claims the whole device or both claim the same part; a claim on the whole node conflicts
with every claim on that node. A booking whose atom is no longer one of the device's
current forms (the GPU was re-partitioned, the VF count changed) is a *stale* claim: the
current partition says nothing about which capacity it held, so it claims the whole
device until it ends, and the new forms are not bookable under it.

The database checks the same rule with rows it can compare (`claim_rows`): one row per
(node, device, part) a claim touches, exclusive or shared, tagged with the device's
*form* (a digest of its current atom ids). An exclusive row conflicts with any other
row of the same key, and two rows of one device with different forms conflict: so whole
vs part, part vs same part and old partition vs new partition overlap nowhere, while two
parts of one partition coexist. The node itself is the device `NODE_DEVICE`: a
whole-node claim holds it exclusively, every other claim shares it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# Classes whose atoms are parts of a partitioned device.
_PART_CLASSES = frozenset({"gpu.mig", "gpu.slot"})


@dataclass(frozen=True, slots=True)
class Claim:
    """What one booked atom holds on its node. `device` None: the whole node; `part`
    None: the whole device."""

    device: str | None
    part: str | None = None

    @property
    def whole_node(self) -> bool:
        return self.device is None


WHOLE_NODE = Claim(None)


def claim_of(atom_id: str, cls: str, device_id: str, attrs: Mapping[str, object]) -> Claim:
    """The claim a booking of this (current) atom makes."""
    if cls == "node":
        return WHOLE_NODE
    device = device_id or atom_id
    if cls in _PART_CLASSES:
        return Claim(device, atom_id)
    # A NIC without SR-IOV is booked whole (the agent marks it `sriov: false`); every
    # other `nic.vf` atom is one VF of its NIC.
    if cls == "nic.vf" and attrs.get("sriov") is not False and device_id:
        return Claim(device, atom_id)
    return Claim(device)


def stale_claim(atom_id: str, cls: str, device_id: str) -> Claim:
    """The claim of a booking on an atom that is no longer a current form of its device."""
    if cls == "node":
        return WHOLE_NODE
    return Claim(device_id or atom_id)


def conflicts(a: Claim, b: Claim) -> bool:
    """Do two claims on one node, overlapping in time, promise the same capacity?"""
    if a.device is None or b.device is None:
        return True
    if a.device != b.device:
        return False
    return a.part is None or b.part is None or a.part == b.part


def overlaps(start_a: int, end_a: int, start_b: int, end_b: int) -> bool:
    """Half-open windows [start, end) share an instant."""
    return start_a < end_b and start_b < end_a


NODE_DEVICE = ""  # the key of the node itself among a node's devices
WHOLE = "*"  # the part key of a whole device
NODE_FORM = "node"


@dataclass(frozen=True, slots=True)
class ClaimRow:
    """One row the database compares: `exclusive` rows conflict with every overlapping
    row of the same (node, device, part); rows of one device with different `form`
    conflict too."""

    device: str
    part: str
    exclusive: bool
    form: str


def form_of(atom_ids: Iterable[str]) -> str:
    """A device's current partition, named by the ids of its current atoms."""
    return hashlib.sha256("\n".join(sorted(atom_ids)).encode()).hexdigest()[:32]


# The node's own rows: the same for every claim, made once.
_NODE_EXCLUSIVE = (ClaimRow(NODE_DEVICE, WHOLE, True, NODE_FORM),)
_NODE_SHARED = ClaimRow(NODE_DEVICE, WHOLE, False, NODE_FORM)


def claim_rows(claim: Claim, form: str) -> tuple[ClaimRow, ...]:
    """The rows that stand for `claim` on a device whose current partition is `form`."""
    if claim.device is None:
        return _NODE_EXCLUSIVE
    node = _NODE_SHARED
    if claim.part is None:
        return node, ClaimRow(claim.device, WHOLE, True, form)
    return (
        node,
        ClaimRow(claim.device, WHOLE, False, form),
        ClaimRow(claim.device, claim.part, True, form),
    )


def merged_rows(rows: Iterable[ClaimRow]) -> list[ClaimRow]:
    """One booking's rows on one node, each key once: its exclusive row stands for its
    own shared rows of the same key (a whole-node booking shares no row with itself)."""
    out: dict[tuple[str, str], ClaimRow] = {}
    for row in rows:
        key = (row.device, row.part)
        held = out.get(key)
        if held is None or (row.exclusive and not held.exclusive):
            out[key] = row
    return [out[k] for k in sorted(out)]
