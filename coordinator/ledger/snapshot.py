"""A pool as the placer needs it for one window: nodes, atoms, and who holds what."""

from __future__ import annotations

from collections import defaultdict

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.domain.model import NodeState
from coordinator.domain.placement import AtomSlot, Holder, NodeSlot, PoolSnapshot
from coordinator.domain.states import node_bucket
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
        pool_free=await _pool_free(conn, pool_id, start, end, nodes, ignore_reservations),
        atom_holders={k: tuple(v) for k, v in holders.items()},
        scalar_holders={
            node: {r: tuple(v) for r, v in res.items()} for node, res in scalars.items()
        },
    )


async def _pool_free(
    conn: AsyncConnection,
    pool_id: str,
    start: int,
    end: int,
    nodes: list[NodeSlot],
    ignore: frozenset[str],
) -> dict[str, int]:
    """Free memoryGiB of the pool at the busiest instant of the window, counting every
    memory booking, node-level or pool-level."""
    s = schema.scalar_bookings.c
    capacity = sum(
        n.capacity.get("memoryGiB", 0) for n in nodes if node_bucket(n.state) == "allocatable"
    )
    rows = await conn.execute(
        select(s.amount, s.start, s.end, s.reservation_id).where(
            (s.pool_id == pool_id) & (s.resource == "memoryGiB") & (s.start < end) & (s.end > start)
        )
    )
    events: list[tuple[int, int]] = []
    for amount, b_start, b_end, rid in rows.all():
        if rid in ignore:
            continue
        events.append((max(b_start, start), int(amount)))
        events.append((min(b_end, end), -int(amount)))
    peak = level = 0
    for _, delta in sorted(events, key=lambda e: (e[0], e[1])):
        level += delta
        peak = max(peak, level)
    return {"memoryGiB": max(0, capacity - peak)}
