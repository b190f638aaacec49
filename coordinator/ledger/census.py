"""The census read: pools, rollup rows, nodes and whole GPUs with their holders now, in
one read transaction, for a metrics scrape."""

from __future__ import annotations

from sqlalchemy import select

from coordinator.domain.census import Census, GpuLine, Holder, NodeLine, gpu_state
from coordinator.domain.model import NodeState
from coordinator.domain.states import node_status
from coordinator.ledger import schema
from coordinator.ledger.database import Database
from coordinator.ledger.pools import PoolRepo
from coordinator.ledger.rollups import read_rollup


async def read_census(db: Database, pools: PoolRepo, now: int) -> Census:
    every_pool = tuple(await pools.list_all())
    n, a, b = schema.nodes.c, schema.atoms.c, schema.bookings.c
    async with db.read() as conn:
        rollup = await read_rollup(conn, (p.pool_id for p in every_pool))
        node_rows = (await conn.execute(select(schema.nodes).order_by(n.node_id))).all()
        gpu_rows = (
            await conn.execute(
                select(a.node_id, a.device_id, a.health)
                .where((a["class"] == "gpu") & (a.retired.is_(False)))
                .order_by(a.node_id, a.device_id)
            )
        ).all()
        # Any atom carved from a GPU (whole, MIG instance, slot) makes that GPU held;
        # the earliest-starting booking names the holder.
        held_rows = (
            await conn.execute(
                select(a.device_id, b.reservation_id, b.tenant_id)
                .join(schema.atoms, a.atom_id == b.atom_id)
                .where(
                    (b.start <= now)
                    & (b.end > now)
                    & a["class"].in_(("gpu", "gpu.mig", "gpu.slot"))
                )
                .order_by(b.start.desc(), b.reservation_id.desc())
            )
        ).all()
    holders = {row.device_id: Holder(row.reservation_id, row.tenant_id) for row in held_rows}
    states: dict[str, NodeState] = {}
    nodes: list[NodeLine] = []
    hostnames: dict[str, tuple[str, str]] = {}
    for row in node_rows:
        state = NodeState(
            reachable=bool(row.reachable),
            health=row.health,
            maintenance=bool(row.maintenance),
            provisioning=bool(row.provisioning),
        )
        states[row.node_id] = state
        hostnames[row.node_id] = (row.hostname, row.pool_id)
        nodes.append(NodeLine(row.node_id, row.hostname, row.pool_id, node_status(state)))
    gpus = []
    for row in gpu_rows:
        if row.node_id not in states:
            continue
        hostname, pool_id = hostnames[row.node_id]
        holder = holders.get(row.device_id)
        what = gpu_state(states[row.node_id], row.health, holder is not None)
        gpus.append(GpuLine(row.device_id, hostname, row.node_id, pool_id, what, holder))
    return Census(every_pool, rollup, tuple(nodes), tuple(gpus))
