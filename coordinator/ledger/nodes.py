"""Nodes and their atoms: inventories, state flags with their events, last-seen.

The ledger does not decide what is a transition (`coordinator.domain.transitions` does):
a `NodeWriter` hands the caller the nodes' flags as stored, then persists the flags
and transitions it is given: columns, one node event per transition, the pools' rollup
refreshed and the at-risk flags of the reservations on those nodes re-judged, all in
one transaction. Plain liveness (last-seen) arrives in batches
from the ingest flusher: one statement for many heartbeats.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from sqlalchemy import bindparam, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.domain.transitions import (
    DeviceFlags,
    NodeFlags,
)
from coordinator.ledger import identities, pool_memory, schema
from coordinator.ledger.bulk import among
from coordinator.ledger.database import Database
from coordinator.ledger.node_writer import NodeWriter
from coordinator.ledger.risk import refresh_risk
from coordinator.ledger.rollups import NodeChange
from shared.wire import HealthStatus


@dataclass(frozen=True, slots=True)
class LivenessRecord:
    """What the liveness tracker is seeded with at start."""

    node_id: str
    pool_id: str
    last_seen: int
    interval_ms: int
    reachable: bool
    health: HealthStatus
    inventory_hash: str


async def _load_flags(conn: AsyncConnection, node_ids: list[str]) -> dict[str, NodeFlags]:
    """The nodes' flags, their rows locked until the transaction ends (PostgreSQL; SQLite
    has one writer already), in id order so that two changes cannot deadlock."""
    n, a = schema.nodes.c, schema.atoms.c
    columns = (
        n.node_id, n.pool_id, n.reachable, n.health, n.health_reasons, n.provisioning,
        n.maintenance, n.maintenance_reason, n.maintenance_by, n.pending_pool_id, n.shape_hold,
        n.duplicate_hold,
    )  # fmt: skip
    node_rows = (
        await conn.execute(
            select(*columns)
            .where(among(conn, n.node_id, node_ids))
            .order_by(n.node_id)
            .with_for_update()
        )
    ).all()
    devices: dict[str, dict[str, DeviceFlags]] = {row.node_id: {} for row in node_rows}
    forms: dict[str, dict[str, set[str]]] = {row.node_id: {} for row in node_rows}
    atom_rows = await conn.execute(
        select(a.node_id, a.device_id, a.atom_id, a.health, a.health_reasons).where(
            among(conn, a.node_id, node_ids) & a.retired.is_(False) & (a.device_id != "")
        )
    )
    for row in atom_rows.all():
        devices[row.node_id][row.device_id] = DeviceFlags(row.health, tuple(row.health_reasons))
        forms[row.node_id].setdefault(row.device_id, set()).add(row.atom_id)
    return {
        row.node_id: NodeFlags(
            pool_id=row.pool_id,
            reachable=bool(row.reachable),
            health=row.health,
            health_reasons=tuple(row.health_reasons),
            provisioning=bool(row.provisioning),
            maintenance=bool(row.maintenance),
            maintenance_reason=row.maintenance_reason,
            maintenance_by=row.maintenance_by,
            devices=devices[row.node_id],
            pending_pool=row.pending_pool_id,
            forms={d: frozenset(ids) for d, ids in forms[row.node_id].items()},
            shape_hold=row.shape_hold or "",
            duplicate_hold=row.duplicate_hold or "",
        )
        for row in node_rows
    }


class NodeRepo:
    def __init__(self, db: Database) -> None:
        self._db = db

    @asynccontextmanager
    async def change(self, node_ids: Iterable[str], now: int) -> AsyncIterator[NodeWriter]:
        """A unit of work over some nodes; commits when the block ends without error,
        refreshing the touched pools' rollup when a transition or inventory was saved."""
        ids = sorted(set(node_ids))
        async with self._db.transaction() as conn:
            changes = NodeWriter(conn, now, await _load_flags(conn, ids))
            rollup = await NodeChange.begin(conn, ids)
            yield changes
            fresh = changes.new_views()
            await changes.flush()
            if changes.changed:
                await rollup.settle(now, fresh)
                risks = await refresh_risk(conn, ids, now)
                touched = changes.touched_pools()
                risks += await pool_memory.refresh_risk(conn, touched, touched, now)
                changes.risks = risks
                if changes.risks and changes.risk_alerts_of is not None:
                    await changes.write_alerts(changes.risk_alerts_of(changes.risks))

    async def shaped_by(self, pool_id: str, profile: tuple[str, int] | None) -> list[str]:
        """The nodes an expected shape applies to: a pool's (`profile` None), or those
        running a profile version."""
        n = schema.nodes.c
        if profile is None:
            cond = n.pool_id == pool_id
        else:
            cond = (n.profile_id == profile[0]) & (n.profile_version == profile[1])
        async with self._db.read() as conn:
            rows = await conn.execute(select(n.node_id).where(cond).order_by(n.node_id))
            return list(rows.scalars().all())

    async def unheld_duplicates(self) -> list[str]:
        """Nodes that show a device another node holds and no duplicate-device hold
        holds (`identities.shown_elsewhere`): as good as none, but a ledger upgraded
        while two ids of one host were registered has them."""
        n, a = schema.nodes.c, schema.atoms.c
        unheld = select(n.node_id).where(n.duplicate_hold.is_(None) | (n.duplicate_hold == ""))
        async with self._db.read() as conn:
            found = await identities.shown_elsewhere(conn, a.node_id.in_(unheld))
        return sorted(found)

    async def pending_moves(self) -> list[str]:
        """Nodes held in their pool while a reported pool move waits."""
        n = schema.nodes.c
        async with self._db.read() as conn:
            rows = await conn.execute(
                select(n.node_id).where(n.pending_pool_id.is_not(None)).order_by(n.node_id)
            )
            return list(rows.scalars().all())

    async def inventory_hashes(self, node_ids: Iterable[str]) -> dict[str, str]:
        n = schema.nodes.c
        async with self._db.read() as conn:
            rows = await conn.execute(
                select(n.node_id, n.inventory_hash).where(n.node_id.in_(list(node_ids)))
            )
            return {node_id: digest for node_id, digest in rows.all()}

    async def flush_last_seen(self, seen: dict[str, tuple[int, int]]) -> None:
        """One executemany for a batch of heartbeats: nodeId → (lastSeen, intervalMs)."""
        if not seen:
            return
        n = schema.nodes.c
        stmt = (
            update(schema.nodes)
            .where(n.node_id == bindparam("b_node_id"))
            .values(last_seen=bindparam("b_last_seen"), interval_ms=bindparam("b_interval"))
        )
        async with self._db.transaction() as conn:
            await conn.execute(
                stmt,
                [{"b_node_id": k, "b_last_seen": t, "b_interval": i} for k, (t, i) in seen.items()],
            )

    async def liveness_snapshot(self) -> list[LivenessRecord]:
        n = schema.nodes.c
        async with self._db.read() as conn:
            rows = await conn.execute(
                select(
                    n.node_id, n.pool_id, n.last_seen, n.interval_ms, n.reachable, n.health,
                    n.inventory_hash,
                )
            )  # fmt: skip
            return [LivenessRecord(*r) for r in rows.all()]
