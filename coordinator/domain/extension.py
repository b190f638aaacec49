"""Moving a live booking's end (`reservations.extend`): the rules on the new end and
what stands in the way of the time it adds.

A booking keeps its devices: extending it asks whether the very atoms (and node
resources) it holds are free for `[old end, new end)` — against every other booking's
claims in that window (`claims.conflicts`, the rule the placer and the database apply),
the nodes' scalar capacity and the pool's memory — never where else it might go. The
added time is judged as a create of those devices over it would be: none on a node out
of service (unreachable, maintenance or held there for a pool move, provisioning or
held for its shape, unhealthy), none on an atom gone unhealthy (the placer never gives
one). A whole-node booking takes its node's every device, faulty ones too, as when it
was booked: a faulty GPU on an allocatable node leaves it at risk, not refused.
Moving the end earlier (not past now) frees time and needs no check. Pure: the window's
snapshot, the booking's own node resources and `now` are passed in.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from coordinator.domain.claims import conflicts
from coordinator.domain.errors import InvalidInput
from coordinator.domain.placement_model import PoolSnapshot
from coordinator.domain.reservation import Reservation
from coordinator.domain.states import node_bucket
from shared.durations import MAX_DURATION_S

GRID_MS = 1000  # a booking lasts whole seconds (`duration`): its end stays on that grid


@dataclass(frozen=True, slots=True)
class NodeAmount:
    """One of the booking's scalar bookings: `amount` of `resource` on a node."""

    node_id: str
    resource: str
    amount: int


def _refused(message: str, kind: str) -> InvalidInput:
    return InvalidInput(message, {"fields": [{"path": "end", "message": message, "type": kind}]})


def check_end(res: Reservation, end: int, now: int) -> None:
    """Refuse (INVALID_INPUT, naming `end`) a new end the booking cannot take: one off
    its whole-second grid, at or before now or its start, or past the longest duration;
    and a booking that is over or being preempted."""
    if not res.live(now):
        raise InvalidInput(
            "the reservation is no longer live",
            {"fields": [{"path": "reservationId", "message": "not live", "type": "state"}]},
        )
    if res.preempt_at is not None:
        raise InvalidInput(
            "the reservation is being preempted; its end cannot move",
            {"fields": [{"path": "reservationId", "message": "preempted", "type": "state"}]},
        )
    if (end - res.start) % GRID_MS:
        raise _refused("end must be whole seconds after the start", "grid")
    if end <= max(now, res.start):
        raise _refused("end must be after now and the start (release ends it now)", "past")
    if end - res.start > MAX_DURATION_S * 1000:
        raise _refused(f"a booking lasts at most {MAX_DURATION_S // 86400} days", "range")


def blockers(
    res: Reservation, snap: PoolSnapshot, own: Iterable[NodeAmount]
) -> list[dict[str, Any]]:
    """What keeps the booking's devices from being free over the snapshot's window,
    each as `{nodeId, atomId | resource, reason}`; [] when nothing does. Other bookings
    are never named (they may be another tenant's)."""
    nodes = {n.node_id: n for n in snap.nodes}
    whole = {b.node_id for b in res.atoms if b.cls == "node"}
    found: list[dict[str, Any]] = []
    for booked in res.atoms:
        node = nodes.get(booked.node_id)
        where = {"nodeId": booked.node_id, "atomId": booked.atom_id}
        if node is None or node_bucket(node.state) != "allocatable":
            state = "gone from the pool" if node is None else f"{node_bucket(node.state)}"
            found.append(where | {"reason": f"its node is {state}"})
            continue
        atom = next((a for a in node.atoms if a.atom_id == booked.atom_id), None)
        if atom is None:
            found.append(where | {"reason": "no longer one of its node's devices"})
            continue
        if not atom.healthy and booked.node_id not in whole:
            found.append(where | {"reason": "its device is unhealthy"})
            continue
        held = snap.held.get(node.node_id) or ()
        if any(
            h.holder.reservation_id != res.reservation_id and conflicts(atom.claim, h.claim)
            for h in held
        ):
            found.append(where | {"reason": "booked by another reservation then"})
    memory = 0
    for sc in own:
        if sc.resource == "memoryGiB":
            memory += sc.amount
        node = nodes.get(sc.node_id)
        if node is None:
            continue  # said above, by its atoms
        used = sum(
            amount
            for amount, holder in (snap.scalar_holders.get(sc.node_id) or {}).get(sc.resource, ())
            if holder.reservation_id != res.reservation_id
        )
        free = node.capacity.get(sc.resource, 0) - used
        if sc.amount > free:
            found.append({"nodeId": sc.node_id, "resource": sc.resource,
                          "reason": f"{max(0, free)} free then, {sc.amount} held"})  # fmt: skip
    pool_free = snap.pool_free.get("memoryGiB")
    if memory and pool_free is not None and memory > pool_free:
        reason = f"the pool has {pool_free} GiB free then, {memory} held"
        found.append({"resource": "memoryGiB", "reason": reason})
    return found
