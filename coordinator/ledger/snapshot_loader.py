"""Reading a pool from the database for the snapshot cache: its nodes with their atoms
and NVLink links, its live bookings resolved to their devices, and the per-pool version
counters that say when either moved (`bump` in every transaction that changes one)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import Select, Update, bindparam, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.domain.claims import NODE_DEVICE
from coordinator.domain.model import NodeState
from coordinator.domain.placement_model import AtomSlot, NodeSlot, healthy_counts
from coordinator.domain.pool_cache import HeldAtom, HeldScalar
from coordinator.ledger import schema
from coordinator.ledger.identities import shown_elsewhere
from shared.cliques import peer_sets

_FAULTY = ("unhealthy", "unmonitored")


def _bump_update(nodes: bool, bookings: bool) -> Update:
    v = schema.pool_versions.c
    values = {}
    if nodes:
        values["nodes_version"] = v.nodes_version + 1
    if bookings:
        values["bookings_version"] = v.bookings_version + 1
    return update(schema.pool_versions).where(v.pool_id == bindparam("w_pool")).values(**values)


def _versions_select() -> Select[Any]:
    v = schema.pool_versions.c
    return select(v.nodes_version, v.bookings_version).where(v.pool_id == bindparam("w_pool"))


# Built once: every booking bumps, and every read under the snapshot cache reads the
# counters; building each statement and its cache key again cost more than running it.
_BUMPS = {(n, b): _bump_update(n, b) for n in (False, True) for b in (False, True) if n or b}
VERSIONS_SELECT = _versions_select()


async def bump(
    conn: AsyncConnection, pool_ids: Iterable[str], *, nodes: bool = False, bookings: bool = False
) -> None:
    statement = _BUMPS.get((nodes, bookings))
    if statement is None:
        return  # nothing to bump
    for pool_id in sorted(set(pool_ids)):
        await conn.execute(statement, {"w_pool": pool_id})


async def versions(conn: AsyncConnection, pool_id: str) -> tuple[int, int]:
    row = (await conn.execute(VERSIONS_SELECT, {"w_pool": pool_id})).first()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def _links(inventory: Mapping[str, Any] | None) -> dict[str, frozenset[str]]:
    """GPU UUID → UUIDs it shares an NVLink with, from a stored inventory's `gpus`; GPUs
    the inventory does not describe are absent (their clique label stands in)."""
    gpus = (inventory or {}).get("gpus") or ()
    return peer_sets(
        (str(g["uuid"]), str(g.get("pciBusId") or ""), tuple(g.get("nvlinkPeers") or ()))
        for g in gpus
        if isinstance(g, dict) and g.get("uuid")
    )


async def load_nodes(conn: AsyncConnection, pool_id: str) -> tuple[NodeSlot, ...]:
    n, a = schema.nodes.c, schema.atoms.c
    node_rows = (
        await conn.execute(select(schema.nodes).where(n.pool_id == pool_id).order_by(n.node_id))
    ).all()
    links = {row.node_id: _links(row.inventory) for row in node_rows}
    atoms: dict[str, list[AtomSlot]] = defaultdict(list)
    atom_rows = await conn.execute(
        select(a.atom_id, a.node_id, a["class"], a.health, a.attrs, a.device_id)
        .where((a.pool_id == pool_id) & (a.retired.is_(False)))
        .order_by(a.atom_id)
    )
    for atom_id, node_id, cls, health, attrs, device_id in atom_rows.all():
        peers = links.get(node_id, {}).get(device_id) if cls == "gpu" else None
        atoms[node_id].append(
            AtomSlot(atom_id, cls, health not in _FAULTY, dict(attrs or {}), device_id or "", peers)
        )
    found = await shown_elsewhere(conn, a.pool_id == pool_id)
    duplicate_of = {node_id: tuple(sorted({c.holder for c in cs})) for node_id, cs in found.items()}
    return tuple(
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
            healthy_by_class=healthy_counts(tuple(atoms[row.node_id])),
            duplicate_of=duplicate_of.get(row.node_id, ()),
        )
        for row in node_rows
    )


async def load_bookings(
    conn: AsyncConnection, pool_id: str, now: int
) -> tuple[list[HeldAtom], list[HeldScalar]]:
    """Bookings that end after `now` (an ended booking can hold nothing later), with the
    device of their atom, retired or not."""
    b, s, a, dc = (
        schema.bookings.c, schema.scalar_bookings.c, schema.atoms.c, schema.device_claims.c
    )  # fmt: skip
    # The partition each live booking was made on, per device (its claim rows say).
    form_rows = await conn.execute(
        select(dc.reservation_id, dc.node_id, dc.device, dc.form)
        .distinct()
        .where(
            dc.reservation_id.in_(
                select(b.reservation_id).where((b.pool_id == pool_id) & (b.end > now))
            )
            & (dc.device != NODE_DEVICE)
        )
    )
    forms = {(r[0], r[1], r[2]): r[3] for r in form_rows.all()}
    atom_rows = await conn.execute(
        select(b.atom_id, b.node_id, b["class"], b.reservation_id, b.spot, b.start, b.end)
        .add_columns(a.device_id)
        .select_from(schema.bookings.outerjoin(schema.atoms, a.atom_id == b.atom_id))
        .where((b.pool_id == pool_id) & (b.end > now) & (b.end > b.start))
    )
    scalar_rows = await conn.execute(
        select(s.node_id, s.resource, s.amount, s.reservation_id, s.spot, s.start, s.end).where(
            (s.pool_id == pool_id) & (s.end > now) & (s.end > s.start)
        )
    )
    return (
        [
            HeldAtom(
                r[0],
                r[1],
                r[2],
                r[3],
                bool(r[4]),
                int(r[5]),
                int(r[6]),
                r[7] or "",
                forms.get((r[3], r[1], r[7] or ""), ""),
            )
            for r in atom_rows.all()
        ],
        [
            HeldScalar(r[0], r[1], int(r[2]), r[3], bool(r[4]), int(r[5]), int(r[6]))
            for r in scalar_rows.all()
        ],
    )
