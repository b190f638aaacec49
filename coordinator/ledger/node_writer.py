"""One transaction's changes to some nodes (`NodeWriter`): new nodes registered in
bulk, a known node's change in its own savepoint, flags and transitions saved with their
node events and outbox alerts. `NodeRepo.change` opens one and settles the rollup and
at-risk flags when it ends. What those rows hold is `node_rows`'.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from types import MappingProxyType

import msgspec
from sqlalchemy import select, update
from sqlalchemy.exc import DataError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.domain import shapes
from coordinator.domain.errors import Conflict, CoordinatorError, UnknownPool
from coordinator.domain.model import AtomView, NodeState, NodeView
from coordinator.domain.node_replacement import Plan
from coordinator.domain.physical_ids import Collision
from coordinator.domain.risk import RiskChange
from coordinator.domain.transitions import (
    HEALTHY_DEVICE,
    NodeFlags,
    Transition,
    forms_of,
)
from coordinator.ledger import identities, node_moves, pool_memory, schema
from coordinator.ledger.bulk import among, insert_rows
from coordinator.ledger.database import lock_pool
from coordinator.ledger.node_rows import (
    event_row,
    flag_values,
    inventory_values,
    new_atom_row,
    new_node_row,
    replace_atoms,
)
from coordinator.ledger.outbox import OutboxWriter
from shared.wire import Alert, Inventory

# How the caller words transitions and risk changes as alerts (services/alerting.py).
AlertsOf = Callable[[str, str, Sequence[Transition]], Sequence[Alert]]
RiskAlertsOf = Callable[[Sequence[RiskChange]], Sequence[Alert]]


class InventoryRefused(Conflict):
    """The ledger cannot record this inventory (its atom ids belong to another node, or
    a constraint refused a row); nothing of it was written."""


class NodeWriter:
    """One transaction's changes to some nodes. `before` is each existing node's flags
    as the transaction found them (absent: no such node).

    New nodes are registered in bulk (`admit` then `register`: their rows are written
    together when the change set ends, a few statements for a whole batch); a change to
    an existing node can be `isolated` in a savepoint so that one refused write leaves
    the rest of the batch standing."""

    def __init__(self, conn: AsyncConnection, now: int, before: dict[str, NodeFlags]) -> None:
        self._conn = conn
        self._now = now
        self.before: Mapping[str, NodeFlags] = MappingProxyType(dict(before))
        # What the rows say now, so that `save` writes only what differs.
        self._current = before
        self.changed = False
        # The alerts for the transitions saved here, committed with them: the caller
        # says how transitions and risk changes read as alerts (`alerts_of`,
        # `risk_alerts_of`); every save writes them to the outbox and `written` lists them.
        self.outbox = OutboxWriter(conn)
        self.alerts_of: AlertsOf | None = None
        self.risk_alerts_of: RiskAlertsOf | None = None
        self.written: list[Alert] = []
        self._new_alerts: list[Alert] = []
        # Reservations that became at risk or recovered; set once the change settles.
        self.risks: list[RiskChange] = []
        self._pools: dict[str, bool] = {}
        self._shapes: dict[tuple[str, str, int], list[dict[str, int]]] = {}
        # Rows of the registered new nodes, written by `flush`.
        self._new_nodes: list[dict[str, object]] = []
        self._new_atoms: list[dict[str, object]] = []
        self._new_events: list[dict[str, object]] = []
        self._new_views: list[NodeView] = []
        # Nodes whose identities a claim of this change judged (`claim_identities`).
        self._judged: set[str] = set()
        # Every transition saved here, per node, in order (the caller's outcome).
        self.saved: dict[str, list[Transition]] = {}

    def flags(self, node_id: str) -> NodeFlags | None:
        """The node's flags as this change has them now (None: no such node)."""
        return self._current.get(node_id)

    async def _pool_exists(self, pool_id: str) -> bool:
        known = self._pools.get(pool_id)
        if known is None:
            p = schema.pools.c
            rows = await self._conn.execute(select(p.pool_id).where(p.pool_id == pool_id))
            known = self._pools[pool_id] = rows.first() is not None
        return known

    async def admit(self, invs: Sequence[Inventory]) -> dict[str, CoordinatorError]:
        """Check inventories of new nodes before `register`: why each that cannot be
        recorded is refused (an unknown pool; atom ids another node holds, or that two
        inventories of the batch both claim). The others are safe to register."""
        refused: dict[str, CoordinatorError] = {}
        for pool_id in sorted({inv.pool_id for inv in invs}):
            await self._pool_exists(pool_id)
        claimed: dict[str, str] = {}
        for inv in invs:
            if not self._pools[inv.pool_id]:
                refused[inv.node_id] = UnknownPool(f"unknown pool {inv.pool_id}")
                continue
            for atom in inv.atoms:
                other = claimed.setdefault(atom.atom_id, inv.node_id)
                if other != inv.node_id:
                    refused[inv.node_id] = InventoryRefused(
                        f"atom {atom.atom_id} is also claimed by node {other}"
                    )
        a = schema.atoms.c
        ids = list(claimed)
        for i in range(0, len(ids), 5000):
            rows = await self._conn.execute(
                select(a.atom_id, a.node_id).where(among(self._conn, a.atom_id, ids[i : i + 5000]))
            )
            for atom_id, holder in rows.all():
                node_id = claimed[atom_id]
                if holder != node_id:
                    refused[node_id] = InventoryRefused(f"atom {atom_id} belongs to node {holder}")
        return refused

    def register(self, inv: Inventory, after: NodeFlags, transitions: Sequence[Transition]) -> None:
        """Queue a new node (admitted by `admit`) with its flags and transitions."""
        now = self._now
        self._new_nodes.append(new_node_row(inv, after, now))
        views = []
        for atom in inv.atoms:
            health = after.device(atom.device_id) if atom.device_id else HEALTHY_DEVICE
            view = AtomView(atom.atom_id, inv.node_id, atom.cls, atom.device_id, health.status)
            views.append(view)
            self._new_atoms.append(new_atom_row(inv, atom, health))
        state = NodeState(after.reachable, after.health, after.maintenance, after.provisioning)
        self._new_views.append(
            NodeView(
                inv.node_id, inv.pool_id, state, tuple(views), inv.scalars.vcpu,
                inv.scalars.memory_gib, inv.scalars.hugepages_1gi,
            )
        )  # fmt: skip
        self._new_events += [event_row(inv.node_id, after.pool_id, t, now) for t in transitions]
        self.saved.setdefault(inv.node_id, []).extend(transitions)
        if self.alerts_of is not None:
            self._new_alerts += self.alerts_of(inv.node_id, after.pool_id, transitions)
        self._current[inv.node_id] = after
        self.changed = True

    async def write_alerts(self, alerts: Sequence[Alert]) -> None:
        """Into the outbox, in this transaction."""
        await self.outbox.add(alerts)
        self.written += alerts

    def new_views(self) -> list[NodeView]:
        """The registered new nodes as the rollup sees them: what reading their rows
        back after `flush` would give."""
        return list(self._new_views)

    async def flush(self) -> None:
        """Write the registered new nodes: one statement per table for the batch."""
        for table, rows in (
            (schema.nodes, self._new_nodes),
            (schema.atoms, self._new_atoms),
            (schema.node_events, self._new_events),
        ):
            await insert_rows(self._conn, table, rows)
        await self.write_alerts(self._new_alerts)
        self._new_nodes, self._new_atoms, self._new_events, self._new_alerts = [], [], [], []
        self._new_views = []

    @asynccontextmanager
    async def isolated(self, node_id: str) -> AsyncIterator[None]:
        """A savepoint around one node's change: when a write is refused (raised here as
        `InventoryRefused`, or whatever the block raised), that node's writes are undone
        and the change set goes on as if it had not been tried."""
        current, changed, written = self._current.get(node_id), self.changed, len(self.written)
        saved = list(self.saved.get(node_id, ()))
        try:
            async with self._conn.begin_nested():
                yield
        except BaseException as exc:
            if current is None:
                self._current.pop(node_id, None)
            else:
                self._current[node_id] = current
            self.changed = changed
            del self.written[written:]  # rolled back with the savepoint
            self.saved[node_id] = saved
            if isinstance(exc, IntegrityError | DataError):
                raise InventoryRefused(str(exc.orig)) from None
            raise

    async def lock_pools(self, pool_ids: Iterable[str]) -> None:
        """Serialise with the pools' booking writers until the end (sorted)."""
        for pool_id in sorted(set(pool_ids)):
            await lock_pool(self._conn, pool_id)

    async def claim_identities(
        self, wanted: Mapping[str, Mapping[str, str]]
    ) -> dict[str, list[Collision]]:
        """Record the physical identities each node's inventory shows (nodeId →
        {identity: deviceId}); per node, those another node holds and keeps
        (`coordinator.ledger.identities`)."""
        self._judged.update(wanted)
        return await identities.claim(self._conn, self._now, wanted)

    async def unheld_duplicates(self) -> dict[str, list[Collision]]:
        """Of this change's nodes that no claim here judged and no duplicate-device hold
        holds, those showing a device another node holds, with the collisions
        (`identities.shown_elsewhere`): one read, none when every node was judged."""
        ids = sorted(
            node_id
            for node_id, flags in self._current.items()
            if node_id not in self._judged and not flags.duplicate_hold
        )
        if not ids:
            return {}
        return await identities.shown_elsewhere(
            self._conn, among(self._conn, schema.atoms.c.node_id, ids)
        )

    async def transfer_identities(self, old: str, new: str) -> None:
        """What `old` holds becomes `new`'s, and `old`'s atoms are retired: its devices
        leave the rollup's totals (its agent publishing again brings them back, held)."""
        await identities.transfer(self._conn, old, new, self._now)
        a = schema.atoms.c
        await self._conn.execute(update(schema.atoms).where(a.node_id == old).values(retired=True))
        self.changed = True

    async def move_bookings(self, old: str, new: str) -> Plan:
        """Move `old`'s bookings that have not ended to `new` where `new` shows the same
        devices, end the others (`coordinator.ledger.node_moves`); call `lock_pools`
        on both nodes' pools first."""
        pools = (self._current[old].pool_id, self._current[new].pool_id)
        found = await node_moves.move_bookings(self._conn, old, new, pools, self._now)
        self.changed = self.changed or bool(found.moves or found.ends)
        return found

    async def holds_bookings(self, node_id: str) -> bool:
        """Has the node a live or future booking (of an atom or of its resources), or
        does its pool's pool-wide memory (interval reservations) still need it?"""
        for table in (schema.bookings, schema.scalar_bookings):
            c = table.c
            found = await self._conn.execute(
                select(c.node_id)
                .where((c.node_id == node_id) & (c.end > self._now) & (c.end > c.start))
                .limit(1)
            )
            if found.first() is not None:
                return True
        pool_id = self._current[node_id].pool_id
        return await pool_memory.needs_node(self._conn, pool_id, node_id, self._now)

    async def expected_shapes(
        self, pool_id: str, profile_id: str | None, profile_version: int | None
    ) -> list[dict[str, int]]:
        """The expected shapes that apply to a node of `pool_id` running that profile
        version: the pool's, the profile version's (read once per change set)."""
        key = (pool_id, profile_id or "", profile_version or 0)
        found = self._shapes.get(key)
        if found is None:
            e = schema.expected_shapes.c
            wanted = (e.pool_id == pool_id) & (e.profile_id == "")
            if profile_id:
                wanted |= (
                    (e.pool_id == "") & (e.profile_id == profile_id)
                    & (e.profile_version == (profile_version or 0))
                )  # fmt: skip
            rows = await self._conn.execute(select(e.counts).where(wanted))
            found = self._shapes[key] = [dict(r.counts) for r in rows.all()]
        return found

    async def accepted_shape(self, node_id: str) -> dict[str, int] | None:
        """The atom counts an operator accepted for the node (None: never)."""
        n = schema.nodes.c
        row = (
            await self._conn.execute(select(n.accepted_shape).where(n.node_id == node_id))
        ).first()
        return dict(row.accepted_shape) if row is not None and row.accepted_shape else None

    async def stored_inventory(self, node_id: str) -> Inventory | None:
        """The node's last recorded inventory (None: none recorded)."""
        n = schema.nodes.c
        row = (await self._conn.execute(select(n.inventory).where(n.node_id == node_id))).one()
        return msgspec.convert(row.inventory, Inventory) if row.inventory else None

    async def accept_shape(self, node_id: str) -> Inventory | None:
        """Record the node's stored inventory's atom counts as accepted; returns that
        inventory."""
        n = schema.nodes.c
        inv = await self.stored_inventory(node_id)
        counts = shapes.counts_of(inv) if inv is not None else {}
        await self._conn.execute(
            update(schema.nodes)
            .where(n.node_id == node_id)
            .values(accepted_shape=counts, updated_at=self._now)
        )
        return inv

    def touched_pools(self) -> dict[str, str]:
        """poolId → a node of this change set that is or was in it."""
        out: dict[str, str] = {}
        for node_id in sorted(set(self.before) | set(self._current)):
            for flags in (self.before.get(node_id), self._current.get(node_id)):
                if flags is not None:
                    out.setdefault(flags.pool_id, node_id)
        return out

    async def put_inventory(self, inv: Inventory, pool_id: str | None = None) -> None:
        """Write what an inventory describes: the node row (a new node starts with a
        fresh node's flags), its atoms (new, changed, retired), in `pool_id` (default:
        the one the inventory names; a node held for a pool move stays where it is).
        Its flags are `save`'s."""
        n = schema.nodes.c
        pool_id = pool_id or inv.pool_id
        if not await self._pool_exists(inv.pool_id):
            raise UnknownPool(f"unknown pool {inv.pool_id}")
        now = self._now
        values = inventory_values(inv, now) | {"pool_id": pool_id}
        current = self._current.get(inv.node_id)
        if current is None:
            fresh = NodeFlags(pool_id)
            await self._conn.execute(
                schema.nodes.insert().values(
                    node_id=inv.node_id,
                    reachable=fresh.reachable,
                    reachable_since=now,
                    health=fresh.health,
                    health_reasons=[],
                    health_since=now,
                    provisioning=fresh.provisioning,
                    maintenance=False,
                    maintenance_reason="",
                    maintenance_by="",
                    created_at=now,
                    **values,
                )
            )
            current = fresh
        else:
            await self._conn.execute(
                update(schema.nodes).where(n.node_id == inv.node_id).values(**values)
            )
        await replace_atoms(self._conn, inv, pool_id)
        devices = {
            a.device_id: current.devices.get(a.device_id, HEALTHY_DEVICE)
            for a in inv.atoms
            if a.device_id
        }
        self._current[inv.node_id] = replace(
            current, pool_id=pool_id, devices=devices, forms=forms_of(inv)
        )
        self.changed = True

    async def save(self, node_id: str, after: NodeFlags, transitions: Sequence[Transition]) -> None:
        """Persist a node's flags and record each transition as a node event."""
        n, a = schema.nodes.c, schema.atoms.c
        cur = self._current[node_id]
        now = self._now
        values = flag_values(cur, after, now)
        if cur.pool_id != after.pool_id:
            # A pending move done: the node and its atoms join the new pool together.
            await self._conn.execute(
                update(schema.atoms).where(a.node_id == node_id).values(pool_id=after.pool_id)
            )
        if values:
            await self._conn.execute(
                update(schema.nodes).where(n.node_id == node_id).values(updated_at=now, **values)
            )
        for device_id, flags in after.devices.items():
            if cur.device(device_id) != flags:
                await self._conn.execute(
                    update(schema.atoms)
                    .where((a.node_id == node_id) & (a.device_id == device_id))
                    .values(health=flags.status, health_reasons=list(flags.reasons))
                )
        if transitions:
            await self._conn.execute(
                schema.node_events.insert(),
                [event_row(node_id, after.pool_id, t, now) for t in transitions],
            )
            if self.alerts_of is not None:
                await self.write_alerts(self.alerts_of(node_id, after.pool_id, transitions))
            self.saved.setdefault(node_id, []).extend(transitions)
        self._current[node_id] = after
        self.changed = self.changed or bool(transitions)
