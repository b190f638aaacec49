"""Node state changes, one transaction each (a batch of inventories too): read the
nodes' flags as stored, compute the flags after and the transitions between
(`coordinator.domain.transitions`), and have the ledger persist both. Nothing here
publishes; the callers hand the outcome to `coordinator.services.alerting`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from coordinator.domain.transitions import (
    Cause,
    DuplicateIdSeen,
    Transition,
    after_heartbeat,
    after_inventory,
    node_transitions,
)
from coordinator.errors import CoordinatorError, NotFound
from coordinator.ledger import Ledger
from shared.wire import Heartbeat, Inventory


@dataclass(frozen=True, slots=True)
class NodeChanges:
    """What one node went through in one unit of work (empty: nothing changed)."""

    node_id: str
    pool_id: str
    transitions: tuple[Transition, ...]


async def record_inventory(ledger: Ledger, inv: Inventory, now: int) -> NodeChanges:
    """Record a full inventory (raises `UnknownPool` for a pool the ledger lacks)."""
    async with ledger.nodes.change([inv.node_id], now) as change:
        before = change.before.get(inv.node_id)
        await change.put_inventory(inv)
        after = after_inventory(before, inv)
        transitions = node_transitions(before, after, hostname=inv.hostname)
        await change.save(inv.node_id, after, transitions)
    return NodeChanges(inv.node_id, inv.pool_id, transitions)


@dataclass(frozen=True, slots=True)
class NotRecorded:
    """An inventory of a batch that the ledger refused; nothing of it was written."""

    node_id: str
    pool_id: str
    error: CoordinatorError


async def record_inventories(
    ledger: Ledger, invs: Sequence[Inventory], now: int
) -> list[NodeChanges | NotRecorded]:
    """Record many full inventories in one unit of work, one outcome each in order.

    New nodes are checked first and written in bulk (a fleet registering is a few
    statements per batch, not a transaction per node); each known node's change runs in
    its own savepoint. Either way one refused inventory (an unknown pool, atom ids that
    belong to another node) is its own `NotRecorded` and the rest are recorded."""
    latest = {inv.node_id: inv for inv in invs}  # the newest of a node's inventories
    out: dict[str, NodeChanges | NotRecorded] = {}
    async with ledger.nodes.change(latest, now) as change:
        new = [inv for inv in latest.values() if inv.node_id not in change.before]
        refused = await change.admit(new)
        for inv in new:
            error = refused.get(inv.node_id)
            if error is not None:
                out[inv.node_id] = NotRecorded(inv.node_id, inv.pool_id, error)
                continue
            after = after_inventory(None, inv)
            transitions = node_transitions(None, after, hostname=inv.hostname)
            change.register(inv, after, transitions)
            out[inv.node_id] = NodeChanges(inv.node_id, inv.pool_id, transitions)
        for inv in latest.values():
            if inv.node_id in out:
                continue
            try:
                async with change.isolated(inv.node_id):
                    before = change.before[inv.node_id]
                    await change.put_inventory(inv)
                    after = after_inventory(before, inv)
                    transitions = node_transitions(before, after, hostname=inv.hostname)
                    await change.save(inv.node_id, after, transitions)
            except CoordinatorError as exc:
                out[inv.node_id] = NotRecorded(inv.node_id, inv.pool_id, exc)
            else:
                out[inv.node_id] = NodeChanges(inv.node_id, inv.pool_id, transitions)
    return [out[inv.node_id] for inv in invs]


async def record_heartbeat(ledger: Ledger, hb: Heartbeat, now: int) -> NodeChanges | None:
    """Record the health a heartbeat reports; None for a node the ledger lacks."""
    async with ledger.nodes.change([hb.node_id], now) as change:
        before = change.before.get(hb.node_id)
        if before is None:
            return None
        after = after_heartbeat(before, hb)
        transitions = node_transitions(before, after)
        if after != before:
            await change.save(hb.node_id, after, transitions)
    return NodeChanges(hb.node_id, after.pool_id, transitions)


async def record_reachability(
    ledger: Ledger, node_ids: Iterable[str], reachable: bool, now: int
) -> list[NodeChanges]:
    """Set the reachable flag of many nodes at once; returns those that flipped."""
    out: list[NodeChanges] = []
    async with ledger.nodes.change(node_ids, now) as change:
        for node_id, before in sorted(change.before.items(), key=lambda item: item[0]):
            after = replace(before, reachable=reachable)
            transitions = node_transitions(before, after)
            if transitions:
                await change.save(node_id, after, transitions)
                out.append(NodeChanges(node_id, after.pool_id, transitions))
    return out


async def record_duplicate_id(
    ledger: Ledger, node_id: str, boot_id: str, other_boot_id: str, now: int
) -> NodeChanges | None:
    """Record that two boots interleave for one node id; its flags stay as they are."""
    async with ledger.nodes.change([node_id], now) as change:
        before = change.before.get(node_id)
        if before is None:
            return None
        transitions: tuple[Transition, ...] = (DuplicateIdSeen(boot_id, other_boot_id),)
        await change.save(node_id, before, transitions)
    return NodeChanges(node_id, before.pool_id, transitions)


async def record_maintenance(
    ledger: Ledger, node_id: str, on: bool, reason: str, by: str, now: int
) -> NodeChanges:
    """Put a node in or out of maintenance; setting the flag it already has changes
    nothing (not even the reason)."""
    async with ledger.nodes.change([node_id], now) as change:
        before = change.before.get(node_id)
        if before is None:
            raise NotFound(f"node {node_id} not found")
        after = replace(
            before,
            maintenance=on,
            maintenance_reason=reason if on else "",
            maintenance_by=by if on else "",
        )
        transitions = node_transitions(before, after, Cause(by, reason))
        if transitions:
            await change.save(node_id, after, transitions)
    return NodeChanges(node_id, before.pool_id, transitions)
