"""Pool moves (SPEC §5 "Truth under change"), as flags (pure).

A node whose agent reports another pool moves at once when it holds no live or future
booking. Otherwise it stays in its old pool, in maintenance with reason `pool change
pending`, until the last of them ends or is released: bookings never cross pools, and
no tenant of the new pool is promised a device a tenant of the old one still holds. An
operator's maintenance and a pending move share the one maintenance flag: switching
maintenance off while a move waits leaves the node held, and the operator's reason,
when given, stays after the move.
"""

from __future__ import annotations

from dataclasses import replace

from coordinator.domain.transitions import COORDINATOR, POOL_CHANGE_PENDING, NodeFlags


def reported(flags: NodeFlags, pool_id: str, holds_bookings: bool) -> NodeFlags:
    """The node's membership after its agent reports `pool_id`; `holds_bookings`: it has
    live or future bookings in its current pool."""
    if pool_id == flags.pool_id:
        # Reported back where it is: a pending move is called off.
        return _let_go(replace(flags, pending_pool=None)) if flags.pending_pool else flags
    if not holds_bookings:
        return moved(replace(flags, pending_pool=pool_id))
    held = replace(flags, pending_pool=pool_id)
    if flags.maintenance:
        return held
    return replace(
        held, maintenance=True, maintenance_reason=POOL_CHANGE_PENDING, maintenance_by=COORDINATOR
    )


def moved(flags: NodeFlags) -> NodeFlags:
    """The pending move done: the node joins its new pool, out of the hold."""
    assert flags.pending_pool is not None
    return _let_go(replace(flags, pool_id=flags.pending_pool, pending_pool=None))


def switched(flags: NodeFlags, on: bool, reason: str, by: str) -> NodeFlags:
    """An operator switches maintenance; a pending move keeps the node held."""
    if on:
        return replace(flags, maintenance=True, maintenance_reason=reason, maintenance_by=by)
    if flags.pending_pool is not None:
        return replace(
            flags,
            maintenance=True,
            maintenance_reason=POOL_CHANGE_PENDING,
            maintenance_by=COORDINATOR,
        )
    return replace(flags, maintenance=False, maintenance_reason="", maintenance_by="")


def _let_go(flags: NodeFlags) -> NodeFlags:
    if flags.held_for_pool_change:
        return replace(flags, maintenance=False, maintenance_reason="", maintenance_by="")
    return flags
