"""Who holds each physical device (`schema.device_identities`, `domain.physical_ids`).

One row per identity names its one holder. Registering claims a node's identities with
an insert that skips the taken ones (`ON CONFLICT DO NOTHING`, returning those it
inserted), then reads who holds the others: on PostgreSQL the primary key makes a
second replica's insert of the same identity wait for the first transaction and then
find it taken, so two replicas registering one host under two node ids cannot both hold
it (no read-then-write race). Rows go in identity order, so two such transactions
cannot deadlock. SQLite has one writer.

A holder gives a device up to a node that reports it when the holder is neither live
(reachable) nor holding a booking that has not ended: a reimaged host that came back
under a new id is offered at once, a second agent on a live host is not.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from sqlalchemy import (
    ColumnElement,
    and_,
    bindparam,
    case,
    delete,
    literal,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.dialects import sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.domain.physical_ids import (
    DISK_IDENTITIES,
    GPU_FORMS,
    NIC_ATTR,
    NIC_IDENTITIES,
    Collision,
    atom_identities,
)
from coordinator.ledger import schema
from coordinator.ledger.bulk import among

_CHUNK = 5000


async def holders(conn: AsyncConnection, identities: Sequence[str]) -> dict[str, str]:
    """identity → the node that holds it, for those of `identities` someone holds."""
    d = schema.device_identities.c
    out: dict[str, str] = {}
    for i in range(0, len(identities), _CHUNK):
        rows = await conn.execute(
            select(d.identity, d.node_id).where(among(conn, d.identity, identities[i : i + _CHUNK]))
        )
        out.update({identity: node_id for identity, node_id in rows.all()})
    return out


# One statement for a batch's rows on PostgreSQL: three arrays, not a parameter set per
# row (registering 10,000 eight-GPU nodes claims 80,000 identities).
_PG_INSERT = text(
    "INSERT INTO device_identities (identity, node_id, device_id, since)"
    " SELECT i, n, d, CAST(:since AS BIGINT) FROM unnest(CAST(:identities AS VARCHAR[]),"
    " CAST(:nodes AS VARCHAR[]), CAST(:devices AS VARCHAR[])) WITH ORDINALITY AS u(i, n, d, k)"
    " ORDER BY k ON CONFLICT (identity) DO NOTHING RETURNING identity, node_id"
)


async def _insert_missing(conn: AsyncConnection, rows: list[dict[str, object]]) -> dict[str, str]:
    """Insert the rows whose identity nobody holds, in their order; returns identity →
    node of those inserted (the others are someone's already: read them back)."""
    if not rows:
        return {}
    if conn.dialect.name == "postgresql":
        result = await conn.execute(
            _PG_INSERT,
            {
                "identities": [r["identity"] for r in rows],
                "nodes": [r["node_id"] for r in rows],
                "devices": [r["device_id"] for r in rows],
                "since": rows[0]["since"],
            },
        )
    else:
        d = schema.device_identities.c
        stmt = (
            sqlite.insert(schema.device_identities)
            .on_conflict_do_nothing(index_elements=["identity"])
            .returning(d.identity, d.node_id)
        )
        result = await conn.execute(stmt, rows)
    return {identity: node_id for identity, node_id in result.all()}


async def _bound(conn: AsyncConnection, node_ids: Iterable[str], now: int) -> set[str]:
    """Of these nodes, those that still hold a physical device: reachable, unknown to
    the ledger (a node of this batch not yet written), or holding a booking not ended."""
    ids = sorted(set(node_ids))
    if not ids:
        return set()
    n = schema.nodes.c
    rows = await conn.execute(select(n.node_id, n.reachable).where(among(conn, n.node_id, ids)))
    known = {node_id: bool(reachable) for node_id, reachable in rows.all()}
    out = {node_id for node_id in ids if known.get(node_id, True)}
    for table in (schema.bookings, schema.scalar_bookings):
        c = table.c
        booked = await conn.execute(
            select(c.node_id)
            .where(among(conn, c.node_id, ids) & (c.end > now) & (c.end > c.start))
            .distinct()
        )
        out.update(booked.scalars().all())
    return out


async def claim(
    conn: AsyncConnection, now: int, wanted: Mapping[str, Mapping[str, str]]
) -> dict[str, list[Collision]]:
    """Record each node's identities (nodeId → {identity: deviceId}, the whole of what
    its inventory shows: identities it no longer shows are let go). Returns, per node,
    the identities another node holds and keeps (empty lists left out)."""
    d = schema.device_identities.c
    reporting = sorted(wanted)
    held = await conn.execute(
        select(d.identity, d.node_id).where(among(conn, d.node_id, reporting))
    )
    gone = [identity for identity, node_id in held.all() if identity not in wanted[node_id]]
    for i in range(0, len(gone), _CHUNK):
        await conn.execute(
            delete(schema.device_identities).where(among(conn, d.identity, gone[i : i + _CHUNK]))
        )
    rows = sorted(
        (
            {"identity": identity, "node_id": node_id, "device_id": device_id, "since": now}
            for node_id, ids in wanted.items()
            for identity, device_id in ids.items()
        ),
        key=lambda r: (str(r["identity"]), str(r["node_id"])),
    )
    inserted = await _insert_missing(conn, rows)
    identities = sorted({str(r["identity"]) for r in rows})
    holder_of = inserted | await holders(conn, [i for i in identities if i not in inserted])
    lost = [r for r in rows if holder_of.get(str(r["identity"])) != r["node_id"]]
    if not lost:
        return {}
    others = {holder_of[str(r["identity"])] for r in lost} - set(reporting)
    free = others - await _bound(conn, others, now)
    takeover = [
        {"b_identity": r["identity"], "b_holder": holder_of[str(r["identity"])],
         "b_node": r["node_id"], "b_since": now}
        for r in lost
        if holder_of[str(r["identity"])] in free
    ]  # fmt: skip
    if takeover:
        # Only from the holder read above: a takeover another transaction made first
        # leaves the row to that one (PostgreSQL re-checks the WHERE after the wait).
        await conn.execute(
            update(schema.device_identities)
            .where((d.identity == bindparam("b_identity")) & (d.node_id == bindparam("b_holder")))
            .values(node_id=bindparam("b_node"), since=bindparam("b_since")),
            takeover,
        )
        holder_of = await holders(conn, identities)
    out: dict[str, list[Collision]] = {}
    for r in lost:
        identity, node_id = str(r["identity"]), str(r["node_id"])
        holder = holder_of.get(identity)
        if holder is not None and holder != node_id:
            out.setdefault(node_id, []).append(Collision(identity, str(r["device_id"]), holder))
    return out


async def transfer(conn: AsyncConnection, old: str, new: str, now: int) -> None:
    """Everything `old` holds becomes `new`'s (an operator said `new` is that host)."""
    d = schema.device_identities.c
    await conn.execute(
        update(schema.device_identities).where(d.node_id == old).values(node_id=new, since=now)
    )


async def held_by(conn: AsyncConnection, node_id: str) -> dict[str, str]:
    """identity → deviceId of what the node holds."""
    d = schema.device_identities.c
    rows = await conn.execute(select(d.identity, d.device_id).where(d.node_id == node_id))
    return {identity: device_id for identity, device_id in rows.all()}


async def shown_elsewhere(
    conn: AsyncConnection, nodes: ColumnElement[bool]
) -> dict[str, list[Collision]]:
    """The one rule for a node that shows a device another node holds: of the nodes
    `nodes` selects (a condition on `schema.atoms`), each whose live atoms show an
    identity (`atom_identities`) another node holds, with those devices and holders.
    The placer turns such a node away (`NodeSlot.duplicate_of`) and a node change holds
    it (`coordinator.services.node_records`). One join on the identity's primary key; a
    MIG instance shows its GPU's identity, which is enough to find it."""
    a, d = schema.atoms.c, schema.device_identities.c
    is_disk = and_(a["class"] == "disk", or_(*(a.device_id.startswith(p) for p in DISK_IDENTITIES)))
    nic_id = a.attrs[NIC_ATTR].as_string()
    is_nic = and_(a["class"] == "nic.vf", or_(*(nic_id.startswith(p) for p in NIC_IDENTITIES)))
    identity = case(
        (a["class"].in_(sorted(GPU_FORMS)), literal("gpu:") + a.device_id),
        (is_disk, literal("disk:") + a.device_id),
        (is_nic, literal("nic:") + nic_id),
        else_=None,
    )
    rows = await conn.execute(
        select(a.node_id, a["class"], a.device_id, a.attrs, d.identity, d.node_id)
        .select_from(schema.atoms.join(schema.device_identities, d.identity == identity))
        .where(nodes & a.retired.is_(False) & (d.node_id != a.node_id))
    )
    # Only colliding atoms come back (as good as none); a missing device is not shown.
    found: dict[str, set[Collision]] = {}
    for node_id, cls, device_id, attrs, held, holder in rows.all():
        shown = atom_identities(cls, device_id or "", attrs or {})
        if held in shown:
            found.setdefault(node_id, set()).add(Collision(held, shown[held], holder))
    return {
        node_id: sorted(cs, key=lambda c: (c.holder, c.identity)) for node_id, cs in found.items()
    }
