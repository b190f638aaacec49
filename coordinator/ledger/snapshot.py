"""A pool as the placer needs it for one window: nodes, atoms, and who holds what."""

from __future__ import annotations

from collections import defaultdict

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.domain.model import NodeState
from coordinator.domain.placement import AtomSlot, Holder, NodeSlot, PoolSnapshot
from coordinator.ledger import schema

_FAULTY = ("unhealthy", "unmonitored")


async def load_snapshot(
    conn: AsyncConnection,
    pool_id: str,
    start: int,
    end: int,
    ignore_reservations: frozenset[str] = frozenset(),
) -> PoolSnapshot:
    n, a = schema.nodes.c, schema.atoms.c
    b, s = schema.bookings.c, schema.scalar_bookings.c
    atoms: dict[str, list[AtomSlot]] = defaultdict(list)
    result = await conn.execute(
        select(a.atom_id, a.node_id, a["class"], a.health, a.attrs)
        .where((a.pool_id == pool_id) & (a.retired.is_(False)))
        .order_by(a.atom_id)
    )
    for atom_id, node_id, cls, health, attrs in result.all():
        atoms[node_id].append(AtomSlot(atom_id, cls, health not in _FAULTY, dict(attrs or {})))
    nodes = []
    node_rows = await conn.execute(
        select(schema.nodes).where(n.pool_id == pool_id).order_by(n.node_id)
    )
    for row in node_rows.all():
        nodes.append(
            NodeSlot(
                node_id=row.node_id,
                state=NodeState(
                    bool(row.reachable), row.health, bool(row.maintenance), bool(row.provisioning)
                ),
                labels=dict(row.labels or {}),
                profile_id=row.profile_id,
                profile_version=row.profile_version,
                atoms=tuple(atoms[row.node_id]),
                capacity={
                    "vcpu": row.vcpu,
                    "memoryGiB": row.memory_gib,
                    "hugepages1Gi": row.hugepages_1gi,
                },
            )
        )
    holders: dict[str, list[Holder]] = defaultdict(list)
    booking_rows = await conn.execute(
        select(b.atom_id, b.reservation_id, b.spot).where(
            (b.pool_id == pool_id) & (b.start < end) & (b.end > start)
        )
    )
    for held_atom, rid, spot in booking_rows.all():
        if rid not in ignore_reservations:
            holders[held_atom].append(Holder(rid, bool(spot)))
    scalars: dict[str, dict[str, list[tuple[int, Holder]]]] = defaultdict(lambda: defaultdict(list))
    scalar_rows = await conn.execute(
        select(s.node_id, s.resource, s.amount, s.reservation_id, s.spot).where(
            (s.pool_id == pool_id) & (s.node_id != "") & (s.start < end) & (s.end > start)
        )
    )
    for held_node, resource, amount, srid, sspot in scalar_rows.all():
        if srid not in ignore_reservations:
            scalars[held_node][resource].append((int(amount), Holder(srid, bool(sspot))))
    return PoolSnapshot(
        tuple(nodes),
        {k: tuple(v) for k, v in holders.items()},
        {node: {r: tuple(v) for r, v in res.items()} for node, res in scalars.items()},
    )
