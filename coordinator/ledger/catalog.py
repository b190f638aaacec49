"""Reads of nodes, atoms and node events for the API (no writes here)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
from sqlalchemy import Row, select

from coordinator.domain.model import AtomRecord, Holder, NodeEvent, NodeRecord, NodeState
from coordinator.ledger import schema
from coordinator.ledger.bulk import among
from coordinator.ledger.database import Database
from shared.wire import Inventory


@dataclass(frozen=True, slots=True)
class NodePage:
    """A page of nodes, and per node its current atoms counted by class."""

    nodes: list[NodeRecord]
    atom_counts: dict[str, dict[str, int]]


@dataclass(frozen=True, slots=True)
class NodeInventory:
    """A node and its last full inventory (None: registered before they were kept)."""

    node: NodeRecord
    inventory: Inventory | None


def node_record(row: Row[Any], atoms: tuple[AtomRecord, ...] = ()) -> NodeRecord:
    return NodeRecord(
        node_id=row.node_id,
        pool_id=row.pool_id,
        hostname=row.hostname,
        labels=dict(row.labels or {}),
        profile_id=row.profile_id,
        profile_version=row.profile_version,
        state=NodeState(
            reachable=bool(row.reachable),
            health=row.health,
            maintenance=bool(row.maintenance),
            provisioning=bool(row.provisioning),
        ),
        reachable_since=row.reachable_since,
        health_reasons=tuple(row.health_reasons or ()),
        health_since=row.health_since,
        maintenance_reason=row.maintenance_reason,
        maintenance_by=row.maintenance_by,
        maintenance_since=row.maintenance_since,
        last_seen=row.last_seen,
        interval_ms=row.interval_ms,
        vcpu=row.vcpu,
        memory_gib=row.memory_gib,
        hugepages_1gi=row.hugepages_1gi,
        atoms=atoms,
        shape_hold=row.shape_hold or "",
        duplicate_hold=row.duplicate_hold or "",
    )


# Every node column but the stored inventory document, which no record shows and which
# dominates the cost of reading a page of nodes.
NODE_COLUMNS = tuple(c for c in schema.nodes.c if c.name != "inventory")


class Catalog:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def node(self, node_id: str, with_atoms: bool = True) -> NodeRecord | None:
        n, a = schema.nodes.c, schema.atoms.c
        async with self._db.read() as conn:
            row = (await conn.execute(select(*NODE_COLUMNS).where(n.node_id == node_id))).first()
            if row is None:
                return None
            atoms: tuple[AtomRecord, ...] = ()
            if with_atoms:
                result = await conn.execute(
                    select(schema.atoms)
                    .where((a.node_id == node_id) & (a.retired.is_(False)))
                    .order_by(a.atom_id)
                )
                atoms = tuple(
                    AtomRecord(
                        r.atom_id,
                        r[3],
                        r.device_id,
                        r.health,
                        tuple(r.health_reasons or ()),
                        dict(r.attrs or {}),
                    )
                    for r in result.all()
                )
        return node_record(row, atoms)

    async def nodes(self, pool_id: str | Sequence[str], after: str | None, limit: int) -> NodePage:
        """A page of the nodes of a pool (or of several) ordered by nodeId, with per node
        its atom counts."""
        n, a = schema.nodes.c, schema.atoms.c
        cond = n.pool_id == pool_id if isinstance(pool_id, str) else n.pool_id.in_(pool_id)
        if after:
            cond = cond & (n.node_id > after)
        async with self._db.read() as conn:
            rows = (
                await conn.execute(
                    select(*NODE_COLUMNS).where(cond).order_by(n.node_id).limit(limit)
                )
            ).all()
            counts: dict[str, dict[str, int]] = defaultdict(dict)
            ids = [r.node_id for r in rows]
            if ids:
                result = await conn.execute(
                    select(a.node_id, a["class"], a.health).where(
                        among(conn, a.node_id, ids) & (a.retired.is_(False))
                    )
                )
                for node_id, cls, _health in result.all():
                    counts[node_id][cls] = counts[node_id].get(cls, 0) + 1
        return NodePage([node_record(r) for r in rows], counts)

    async def inventories(self, pool_id: str, after: str | None, limit: int) -> list[NodeInventory]:
        """A page of a pool's nodes by nodeId, each with its last full inventory."""
        n = schema.nodes.c
        cond = n.pool_id == pool_id
        if after:
            cond = cond & (n.node_id > after)
        columns = (*NODE_COLUMNS, n.inventory)
        query = select(*columns).where(cond).order_by(n.node_id).limit(limit)
        async with self._db.read() as conn:
            rows = (await conn.execute(query)).all()
        return [
            NodeInventory(
                node_record(r), msgspec.convert(r.inventory, Inventory) if r.inventory else None
            )
            for r in rows
        ]

    async def holders(self, node_id: str, now: int) -> dict[str, Holder]:
        """atomId → the reservation holding it now (a booking running at `now`)."""
        b, rv = schema.bookings.c, schema.reservations.c
        async with self._db.read() as conn:
            rows = await conn.execute(
                select(b.atom_id, b.reservation_id, b.tenant_id, rv.project_id, b.end)
                .select_from(
                    schema.bookings.outerjoin(
                        schema.reservations, rv.reservation_id == b.reservation_id
                    )
                )
                .where((b.node_id == node_id) & (b.start <= now) & (b.end > now))
            )
            return {
                r.atom_id: Holder(r.reservation_id, r.tenant_id, r.project_id, int(r.end))
                for r in rows.all()
            }

    async def events(self, node_id: str, after: int = 0, limit: int = 100) -> list[NodeEvent]:
        e = schema.node_events.c
        async with self._db.read() as conn:
            rows = await conn.execute(
                select(schema.node_events)
                .where((e.node_id == node_id) & (e.event_id > after))
                .order_by(e.event_id)
                .limit(limit)
            )
            return [
                NodeEvent(
                    r.event_id, r.node_id, r.pool_id, r.kind, r.reason, r.by, r.at, r.device_id
                )
                for r in rows.all()
            ]
