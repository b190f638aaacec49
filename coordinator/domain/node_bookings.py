"""The bookings on one node as its agent is told them (`shared.wire.NodeBookings`): which
reservations hold which of the node's devices, from now on, and a content hash (the
etag) that every replica computes alike from the same ledger.

Pure: booking rows and their reservations in, wire values out. Each booked atom becomes
the device a launcher binds to: a GPU's UUID, a MIG instance's own UUID, a time-slice
or MPS slot its GPU's UUID, a NIC VF its PCI address, a disk its stable id. Devices are
ordered by GPU index (then MIG instance, slot), then NICs and disks, so that
`CUDA_VISIBLE_DEVICES` comes out in device index order; bookings by start, then id.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from coordinator.domain.reservation import Reservation
from shared.reservation_states import LIVE_STATES
from shared.wire import BookedDevice, NodeBooking

# GPU forms share a rank: a booking of whole GPUs and MIG instances lists them all by
# GPU index. The node atom (a whole-node booking) names no device and comes first.
_RANK = {"node": 0, "gpu": 1, "gpu.mig": 1, "gpu.slot": 1, "nic.vf": 2, "disk": 3}
_ENCODER = msgspec.json.Encoder()
# NodeBookings.bookings' most items (shared.wire): an agent refuses a longer list whole,
# so the earliest are sent.
MAX_NODE_BOOKINGS = 4096


@dataclass(frozen=True, slots=True)
class BookedRow:
    """One booking row of the ledger on the node, with the atom it holds."""

    reservation_id: str
    node_id: str
    pool_id: str
    start: int
    end: int
    atom_id: str
    cls: str
    device_id: str
    attrs: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class PoolBookings:
    """A pool's booking rows that have not ended, and the reservations they belong to."""

    rows: tuple[BookedRow, ...]
    reservations: Mapping[str, Reservation]


@dataclass(frozen=True, slots=True)
class PoolVersion:
    """A pool's version counters: either moving means its bookings may have changed."""

    nodes: int
    bookings: int


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else -1


def booked_device(row: BookedRow) -> BookedDevice:
    attrs = row.attrs
    if row.cls == "gpu.mig":  # the atom's device is its GPU; the instance has its own UUID
        return BookedDevice(
            atom_id=row.atom_id, cls="gpu.mig", device_id=str(attrs.get("uuid") or "")
        )
    if row.cls == "nic.vf":
        pci = attrs.get("pciAddress")
        return BookedDevice(
            atom_id=row.atom_id,
            cls="nic.vf",
            device_id=row.device_id,
            pci_address=str(pci) if pci else None,
        )
    cls = row.cls if row.cls in _RANK else "node"
    return BookedDevice(atom_id=row.atom_id, cls=cls, device_id=row.device_id)  # type: ignore[arg-type]


def _order(row: BookedRow) -> tuple[int, int, int, int, int, str]:
    a = row.attrs
    return (
        _RANK.get(row.cls, 9),
        _int(a.get("gpuIndex")),
        _int(a.get("gpuInstanceId")),
        _int(a.get("computeInstanceId")),
        _int(a.get("replica", a.get("vfIndex"))),
        row.atom_id,
    )


def node_bookings(
    rows: Iterable[BookedRow], reservations: Mapping[str, Reservation], now: int
) -> dict[str, tuple[NodeBooking, ...]]:
    """Node id → its live and future bookings at `now` (rows that ended, or whose
    reservation is no longer live, are left out)."""
    held: dict[tuple[str, str], list[BookedRow]] = {}
    for row in rows:
        res = reservations.get(row.reservation_id)
        if row.end <= now or res is None or res.state(now) not in LIVE_STATES:
            continue
        held.setdefault((row.node_id, row.reservation_id), []).append(row)
    out: dict[str, list[NodeBooking]] = {}
    for (node_id, rid), mine in held.items():
        res = reservations[rid]
        mine.sort(key=_order)
        out.setdefault(node_id, []).append(
            NodeBooking(
                reservation_id=rid,
                tenant_id=res.tenant_id,
                state=res.state(now),
                start=min(r.start for r in mine),
                end=max(r.end for r in mine),
                devices=tuple(booked_device(r) for r in mine),
            )
        )
    return {
        node: tuple(sorted(items, key=lambda b: (b.start, b.reservation_id))[:MAX_NODE_BOOKINGS])
        for node, items in out.items()
    }


def etag(bookings: tuple[NodeBooking, ...]) -> str:
    """A hash of the content: the same bookings give the same etag on every replica."""
    return hashlib.sha256(_ENCODER.encode(bookings)).hexdigest()[:32]


EMPTY_ETAG = etag(())


def next_change(
    bookings: tuple[NodeBooking, ...], reservations: Mapping[str, Reservation], now: int
) -> int | None:
    """The first moment after `now` at which the content changes by the clock alone
    (a booking starts or ends, a notice or lease runs out), None if never."""
    moments: list[int] = []
    for b in bookings:
        moments += [b.start, b.end]
        res = reservations.get(b.reservation_id)
        if res is not None:
            moments += [m for m in (res.preempt_at, res.lease_expires_at) if m is not None]
    later = [m for m in moments if m > now]
    return min(later) if later else None
