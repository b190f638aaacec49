"""Whole GPUs per GPU model within a pool, for `byGpuModel` of a pool that declares no
model (a mixed pool of A100s and L40S would otherwise be lumped under `other`).

Counted as the rollup counts (`coordinator.domain.rollup`), per atom by the model its
agent reports: every live `gpu` atom in `total`, those in the allocatable bucket in
`allocatable`, allocatable atoms booked now in `allocated` and booked to start later in
`reserved`, and `available = max(0, allocatable - allocated - reserved)`. Read at the
time asked, not from the stored rollup rows, which have no model.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.domain.states import atom_bucket
from coordinator.ledger import schema
from coordinator.ledger.rollups import allocatable_scope, load_node_views

OTHER = "other"  # a GPU whose agent reports no model
COLUMNS = ("total", "allocatable", "allocated", "reserved", "available")


def _model(attrs: Any) -> str:
    model = attrs.get("model") if isinstance(attrs, dict) else None
    return str(model) if model else OTHER


async def gpu_model_totals(
    conn: AsyncConnection, pool_id: str, now: int
) -> dict[str, dict[str, int]]:
    """Per model of the pool's whole GPUs, the rollup's gpu columns (models with none
    left out)."""
    a, b = schema.atoms.c, schema.bookings.c
    rows = await conn.execute(
        select(a.atom_id, a.attrs).where(
            (a.pool_id == pool_id) & (a["class"] == "gpu") & a.retired.is_(False)
        )
    )
    model_of = {row.atom_id: _model(row.attrs) for row in rows.all()}
    counts: dict[str, dict[str, int]] = {}
    for node in await load_node_views(conn, pool_id):
        for atom in node.atoms:
            if atom.cls != "gpu" or atom.atom_id not in model_of:
                continue
            c = counts.setdefault(model_of[atom.atom_id], dict.fromkeys(COLUMNS, 0))
            c["total"] += 1
            if atom_bucket(node.state, atom) == "allocatable":
                c["allocatable"] += 1
    nodes, excluded = await allocatable_scope(conn, pool_id)
    if nodes:
        in_scope = (b.pool_id == pool_id) & b.node_id.in_(nodes) & (b["class"] == "gpu")
        if excluded:
            in_scope &= b.atom_id.not_in(excluded)
        for column, cond in (("allocated", (b.start <= now) & (b.end > now)),
                             ("reserved", b.start > now)):  # fmt: skip
            booked = await conn.execute(select(b.atom_id).where(in_scope & cond).distinct())
            for atom_id in booked.scalars().all():
                model = model_of.get(atom_id)
                if model in counts:
                    counts[model][column] += 1
    for c in counts.values():
        c["available"] = max(0, c["allocatable"] - c["allocated"] - c["reserved"])
    return dict(sorted(counts.items()))
