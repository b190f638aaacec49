"""Node state changes, one transaction each (a batch of inventories too): read the
nodes' flags as stored, compute the flags after and the transitions between
(`coordinator.domain.transitions`), and have the ledger persist both, with their alerts
(and those of the reservations the change put at risk or let recover) in the outbox of
the same transaction. Nothing here publishes; the callers announce the committed alerts
through `coordinator.services.alerting`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace

from coordinator.domain import physical_ids, pool_moves, shapes
from coordinator.domain.errors import CoordinatorError, InvalidInput, NotFound
from coordinator.domain.inventory_truth import UntrueReason, untrue
from coordinator.domain.risk import RiskChange
from coordinator.domain.transitions import (
    Cause,
    DuplicateIdSeen,
    NodeReplaced,
    Transition,
    after_heartbeat,
    after_inventory,
    node_transitions,
)
from coordinator.ledger import Ledger, NodeWriter
from coordinator.services.alerting import alerts_for, risk_alerts
from shared.wire import Alert, Heartbeat, Inventory


@dataclass(frozen=True, slots=True)
class NodeOutcome:
    """What one node went through in one unit of work (empty: nothing changed), and the
    reservations on it that became at risk or recovered."""

    node_id: str
    pool_id: str
    transitions: tuple[Transition, ...]
    risks: tuple[RiskChange, ...] = ()
    alerts: tuple[Alert, ...] = ()  # committed to the outbox with the change

    @property
    def put_at_risk(self) -> int:
        return sum(1 for r in self.risks if r.at_risk is not None)


@asynccontextmanager
async def _changing(ledger: Ledger, node_ids: Iterable[str], now: int) -> AsyncIterator[NodeWriter]:
    """The ledger's change set over these nodes, writing each transition's and each
    risk change's alert to the outbox as it is recorded."""
    async with ledger.nodes.change(node_ids, now) as change:
        change.alerts_of = lambda node_id, pool_id, ts: alerts_for(node_id, pool_id, ts, now)
        change.risk_alerts_of = lambda risks: risk_alerts(risks, now)
        yield change
        await _hold_duplicates(change)


async def _hold_duplicates(change: NodeWriter) -> None:
    """Hold each node of the change that shows a device another node holds and is not
    held for it yet, whatever brought it here (an old id back by heartbeat alone after
    a new id took its devices, a ledger upgraded with two ids of one host registered):
    the reason and the `node.duplicateDevice` alert an inventory's collision gives. A
    node whose inventory this change recorded was judged by its claim already."""
    for node_id, collisions in sorted((await change.unheld_duplicates()).items()):
        flags = change.flags(node_id)
        assert flags is not None  # a node of this change
        after = physical_ids.judged(flags, physical_ids.hold_reason(collisions))
        transitions = (
            *node_transitions(flags, after),
            *physical_ids.duplicate_device(flags, after, collisions),
        )
        await change.save(node_id, after, transitions)


async def hold_duplicates(ledger: Ledger, now: int) -> list[NodeOutcome]:
    """Hold every node that shows a device another node holds and no hold holds yet
    (the coordinator's start and its rollup rebuild call this): the nodes a ledger
    upgraded with two ids of one host registered has, which no change has judged."""
    found = await ledger.nodes.unheld_duplicates()
    if not found:
        return []
    async with _changing(ledger, found, now) as change:
        pass  # the change's own end holds them
    return _with_risks(
        [NodeOutcome(n, f.pool_id, ()) for n in found if (f := change.flags(n)) is not None],
        change,
    )


def _one(change: NodeWriter, node_id: str, pool_id: str, ts: Sequence[Transition]) -> NodeOutcome:
    return NodeOutcome(
        node_id, pool_id, _saved(change, node_id, ts), tuple(change.risks), tuple(change.written)
    )


def _saved(change: NodeWriter, node_id: str, ts: Sequence[Transition]) -> tuple[Transition, ...]:
    """The node's transitions: those the change saved (a hold its end added included),
    else the caller's."""
    saved = change.saved.get(node_id)
    return tuple(saved) if saved is not None else tuple(ts)


def _with_risks(out: list[NodeOutcome], change: NodeWriter) -> list[NodeOutcome]:
    """Each risk change and each alert written goes with the node it is about (one
    change may touch many)."""
    risks: dict[str, list[RiskChange]] = {}
    for r in change.risks:
        risks.setdefault(r.node_id, []).append(r)
    alerts: dict[str, list[Alert]] = {}
    for a in change.written:
        alerts.setdefault(a.node_id, []).append(a)
    merged = [
        replace(
            c,
            transitions=_saved(change, c.node_id, c.transitions),
            risks=tuple(risks.pop(c.node_id, ())),
            alerts=tuple(alerts.pop(c.node_id, ())),
        )
        for c in out
    ]
    merged += [
        NodeOutcome(node_id, rs[0].pool_id, (), tuple(rs), tuple(alerts.pop(node_id, ())))
        for node_id, rs in risks.items()
    ]
    return merged


class UntrueInventory(InvalidInput):
    """An inventory no host can have (`coordinator.domain.inventory_truth`): refused
    whole, nothing of it written."""

    def __init__(self, reason: UntrueReason, message: str) -> None:
        super().__init__(f"inventory refused ({reason}): {message}")
        self.reason = reason


def check_inventory(inv: Inventory) -> None:
    finding = untrue(inv)
    if finding is not None:
        raise UntrueInventory(finding.reason, finding.message)


async def record_inventory(ledger: Ledger, inv: Inventory, now: int) -> NodeOutcome:
    """Record a full inventory (raises `UnknownPool` for a pool the ledger lacks,
    `UntrueInventory` for one no host can have). A node reported in another pool moves
    there only if it holds no live or future booking; otherwise it is held in its pool
    until they end (`settle_pool_moves`)."""
    check_inventory(inv)
    async with _changing(ledger, [inv.node_id], now) as change:
        pool_id, transitions = await _put_inventory(change, inv)
    return _one(change, inv.node_id, pool_id, transitions)


async def _put_inventory(change: NodeWriter, inv: Inventory) -> tuple[str, tuple[Transition, ...]]:
    """One node's inventory inside `change`: the pool it is in after (a reported move
    is held while the node has bookings) and its transitions."""
    before = change.before.get(inv.node_id)
    membership = before
    if before is not None and (inv.pool_id != before.pool_id or before.pending_pool):
        # Under both pools' locks: no booking can land on it while this decides.
        await change.lock_pools([before.pool_id, inv.pool_id])
        held = await change.holds_bookings(inv.node_id)
        membership = pool_moves.reported(before, inv.pool_id, held)
    pool_id = membership.pool_id if membership is not None else inv.pool_id
    await change.put_inventory(inv, pool_id)
    wanted = {inv.node_id: physical_ids.identities_of(inv)}
    collisions = (await change.claim_identities(wanted)).get(inv.node_id, [])
    after = replace(after_inventory(membership, inv), pool_id=pool_id)
    hold = physical_ids.kept(before, physical_ids.hold_reason(collisions))
    after = physical_ids.judged(after, hold)
    after = shapes.judged(after, await _shape_hold(change, inv, pool_id))
    transitions = (
        *node_transitions(before, after, hostname=inv.hostname),
        *physical_ids.duplicate_device(before, after, collisions),
    )
    await change.save(inv.node_id, after, transitions)
    return pool_id, transitions


async def _shape_hold(change: NodeWriter, inv: Inventory, pool_id: str) -> str:
    """Why the inventory holds its node in provisioning ("" when it does not): more
    atoms than an expected shape of its pool or profile, beyond what was accepted."""
    expected = await change.expected_shapes(pool_id, inv.profile_id, inv.profile_version)
    if not expected:
        return ""
    accepted = await change.accepted_shape(inv.node_id) if inv.node_id in change.before else None
    return shapes.hold_reason(shapes.counts_of(inv), expected, accepted)


async def accept_shape(ledger: Ledger, node_id: str, by: str, now: int) -> NodeOutcome:
    """An operator accepts the node's inventory as it is: its atom counts are recorded
    as accepted and a hold for exceeding an expected shape ends (NotFound for a node
    the ledger lacks). A later inventory with more than was accepted is held again."""
    async with _changing(ledger, [node_id], now) as change:
        before = change.before.get(node_id)
        if before is None:
            raise NotFound(f"node {node_id} not found")
        inv = await change.accept_shape(node_id)
        # The agent's own word on provisioning is its last inventory's.
        agent = inv.provisioning if inv is not None else before.provisioning
        after = shapes.judged(replace(before, provisioning=agent), "")
        transitions = node_transitions(before, after, Cause(by, "shape accepted"))
        await change.save(node_id, after, transitions)
    return _one(change, node_id, before.pool_id, transitions)


async def rejudge_shapes(ledger: Ledger, node_ids: Sequence[str], now: int) -> list[NodeOutcome]:
    """Judge nodes' last inventories against the expected shapes as they are now (one
    was set or cleared): held, or let go, without waiting for their next inventory."""
    out: list[NodeOutcome] = []
    async with _changing(ledger, node_ids, now) as change:
        for node_id, before in sorted(change.before.items()):
            inv = await change.stored_inventory(node_id)
            if inv is None:
                continue
            # A held node's flag is the hold's; the agent's own word is its inventory's.
            agent = (
                inv.provisioning
                if before.shape_hold or before.duplicate_hold
                else before.provisioning
            )
            hold = await _shape_hold(change, inv, before.pool_id)
            after = shapes.judged(replace(before, provisioning=agent), hold)
            transitions = node_transitions(before, after)
            if after != before:
                await change.save(node_id, after, transitions)
                out.append(NodeOutcome(node_id, before.pool_id, transitions))
    return _with_risks(out, change)


async def settle_pool_moves(ledger: Ledger, now: int) -> list[NodeOutcome]:
    """Move every node held for a pool move whose last booking in its old pool has
    ended (the reservation clock and releases call this)."""
    out: list[NodeOutcome] = []
    for node_id in await ledger.nodes.pending_moves():
        async with _changing(ledger, [node_id], now) as change:
            before = change.before.get(node_id)
            if before is None or before.pending_pool is None:
                continue
            await change.lock_pools([before.pool_id, before.pending_pool])
            if await change.holds_bookings(node_id):
                continue
            after = pool_moves.moved(before)
            transitions = node_transitions(before, after)
            await change.save(node_id, after, transitions)
        out.append(_one(change, node_id, after.pool_id, transitions))
    return out


@dataclass(frozen=True, slots=True)
class NotRecorded:
    """An inventory of a batch that the ledger refused; nothing of it was written."""

    node_id: str
    pool_id: str
    error: CoordinatorError


async def record_inventories(
    ledger: Ledger, invs: Sequence[Inventory], now: int
) -> list[NodeOutcome | NotRecorded]:
    """Record many full inventories in one unit of work, one outcome each in order.

    New nodes are checked first and written in bulk (a fleet registering is a few
    statements per batch, not a transaction per node); each known node's change runs in
    its own savepoint. Either way one refused inventory (an unknown pool, atom ids that
    belong to another node) is its own `NotRecorded` and the rest are recorded."""
    latest = {inv.node_id: inv for inv in invs}  # the newest of a node's inventories
    out: dict[str, NodeOutcome | NotRecorded] = {}
    for inv in list(latest.values()):
        try:
            check_inventory(inv)
        except UntrueInventory as exc:
            out[inv.node_id] = NotRecorded(inv.node_id, inv.pool_id, exc)
            del latest[inv.node_id]
    async with _changing(ledger, latest, now) as change:
        new = [inv for inv in latest.values() if inv.node_id not in change.before]
        refused = await change.admit(new)
        admitted = [inv for inv in new if inv.node_id not in refused]
        found = await change.claim_identities(
            {inv.node_id: physical_ids.identities_of(inv) for inv in admitted}
        )
        for inv in new:
            error = refused.get(inv.node_id)
            if error is not None:
                out[inv.node_id] = NotRecorded(inv.node_id, inv.pool_id, error)
                continue
            collisions = found.get(inv.node_id, [])
            after = physical_ids.judged(
                after_inventory(None, inv), physical_ids.hold_reason(collisions)
            )
            after = shapes.judged(after, await _shape_hold(change, inv, inv.pool_id))
            transitions = (
                *node_transitions(None, after, hostname=inv.hostname),
                *physical_ids.duplicate_device(None, after, collisions),
            )
            change.register(inv, after, transitions)
            out[inv.node_id] = NodeOutcome(inv.node_id, inv.pool_id, transitions)
        for inv in latest.values():
            if inv.node_id in out:
                continue
            try:
                async with change.isolated(inv.node_id):
                    pool_id, transitions = await _put_inventory(change, inv)
            except CoordinatorError as exc:
                out[inv.node_id] = NotRecorded(inv.node_id, inv.pool_id, exc)
            else:
                out[inv.node_id] = NodeOutcome(inv.node_id, pool_id, transitions)
    # Reservations put at risk or recovered go with the node they are about.
    recorded = [c for c in out.values() if isinstance(c, NodeOutcome)]
    for c in _with_risks(recorded, change):
        if isinstance(out.get(c.node_id), NodeOutcome):
            out[c.node_id] = c
    return [out[inv.node_id] for inv in invs]


async def record_heartbeat(ledger: Ledger, hb: Heartbeat, now: int) -> NodeOutcome | None:
    """Record the health a heartbeat reports; None for a node the ledger lacks."""
    async with _changing(ledger, [hb.node_id], now) as change:
        before = change.before.get(hb.node_id)
        if before is None:
            return None
        after = shapes.judged(after_heartbeat(before, hb), before.shape_hold)
        transitions = node_transitions(before, after)
        if after != before:
            await change.save(hb.node_id, after, transitions)
    return _one(change, hb.node_id, after.pool_id, transitions)


async def record_reachability(
    ledger: Ledger, node_ids: Iterable[str], reachable: bool, now: int
) -> list[NodeOutcome]:
    """Set the reachable flag of many nodes at once; returns those that flipped."""
    out: list[NodeOutcome] = []
    async with _changing(ledger, node_ids, now) as change:
        for node_id, before in sorted(change.before.items(), key=lambda item: item[0]):
            after = replace(before, reachable=reachable)
            transitions = node_transitions(before, after)
            if transitions:
                await change.save(node_id, after, transitions)
                out.append(NodeOutcome(node_id, after.pool_id, transitions))
    return _with_risks(out, change)


async def record_duplicate_id(
    ledger: Ledger, node_id: str, boot_id: str, other_boot_id: str, now: int
) -> NodeOutcome | None:
    """Record that two boots interleave for one node id; its flags stay as they are."""
    async with _changing(ledger, [node_id], now) as change:
        before = change.before.get(node_id)
        if before is None:
            return None
        transitions: tuple[Transition, ...] = (DuplicateIdSeen(boot_id, other_boot_id),)
        await change.save(node_id, before, transitions)
    return _one(change, node_id, before.pool_id, transitions)


async def record_maintenance(
    ledger: Ledger, node_id: str, on: bool, reason: str, by: str, now: int
) -> NodeOutcome:
    """Put a node in or out of maintenance; setting the flag it already has changes
    nothing (not even the reason), except that an operator's reason replaces the hold of
    a pending pool move, and a node held for one stays in maintenance."""
    async with _changing(ledger, [node_id], now) as change:
        before = change.before.get(node_id)
        if before is None:
            raise NotFound(f"node {node_id} not found")
        after = before
        if not (on and before.maintenance and not before.held_for_pool_change):
            after = pool_moves.switched(before, on, reason, by)
        transitions = node_transitions(before, after, Cause(by, reason))
        if after != before:
            await change.save(node_id, after, transitions)
    return _one(change, node_id, before.pool_id, transitions)


@dataclass(frozen=True, slots=True)
class Replaced:
    """`old` retired in favour of `new` (an operator's `nodes.replace`): each node's
    change, and the reservations of `old` that moved to `new` or ended."""

    old: NodeOutcome
    new: NodeOutcome
    moved: tuple[str, ...]
    ended: tuple[str, ...]


async def replace_node(ledger: Ledger, old: str, new: str, by: str, now: int) -> Replaced:
    """An operator says `new` is the host `old` was (NotFound for a node the ledger
    lacks, InvalidInput for one node twice): `old`'s bookings that have not ended move to
    `new` where it shows the same devices, the others end; what `old` held is `new`'s;
    `old` is held in provisioning as replaced, and `new`'s duplicate-device hold ends
    (unless a third node still holds one of its devices)."""
    if old == new:
        raise InvalidInput("a node cannot replace itself")
    async with _changing(ledger, [old, new], now) as change:
        b_old, b_new = change.before.get(old), change.before.get(new)
        for node_id, flags in ((old, b_old), (new, b_new)):
            if flags is None:
                raise NotFound(f"node {node_id} not found")
        assert b_old is not None and b_new is not None
        await change.lock_pools([b_old.pool_id, b_new.pool_id])
        found = await change.move_bookings(old, new)
        await change.transfer_identities(old, new)
        inv = await change.stored_inventory(new)
        collisions = []
        if inv is not None:
            wanted = {new: physical_ids.identities_of(inv)}
            collisions = (await change.claim_identities(wanted)).get(new, [])
        # The agent's own word on provisioning is its last inventory's.
        agent = inv.provisioning if inv is not None else b_new.provisioning
        after_new = physical_ids.judged(
            replace(b_new, provisioning=agent), physical_ids.hold_reason(collisions)
        )
        after_new = shapes.judged(after_new, b_new.shape_hold)
        after_old = physical_ids.judged(b_old, physical_ids.replaced_reason(new))
        cause = Cause(by, f"node {new} replaces node {old}")
        replaced = NodeReplaced(new, by, tuple(sorted(found.moves)), found.ends)
        t_old = (replaced, *node_transitions(b_old, after_old, cause))
        t_new = node_transitions(b_new, after_new, cause)
        await change.save(old, after_old, t_old)
        await change.save(new, after_new, t_new)
    out = _with_risks(
        [NodeOutcome(old, after_old.pool_id, t_old), NodeOutcome(new, after_new.pool_id, t_new)],
        change,
    )
    by_node = {o.node_id: o for o in out}
    return Replaced(by_node[old], by_node[new], tuple(sorted(found.moves)), found.ends)
