"""Moving a replaced node's bookings to the node an operator says is that host
(`nodes.replace`; which move and which end is `coordinator.domain.node_replacement`).

A moved reservation keeps its id, times and tenant: its booking rows name the new
node's counterpart atoms, its scalar bookings and device claims the new node (claims
of the device's current partition take the new node's partition digest, so the claim
rules compare them with the new node's own), and its stored atom list says so. One
that cannot move ends now as `preempted`. The caller holds both nodes' pool locks.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import bindparam, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.domain.claims import form_of
from coordinator.domain.node_replacement import HeldAtom, Plan, plan
from coordinator.domain.reservation import LIVE
from coordinator.ledger import schema
from coordinator.ledger.reservations import end_bookings
from coordinator.ledger.rollups import refresh_booked
from coordinator.ledger.snapshot_loader import bump


async def _held(conn: AsyncConnection, node_id: str, now: int) -> list[HeldAtom]:
    b = schema.bookings.c
    rows = await conn.execute(
        select(b.reservation_id, b.atom_id, b.start, b.end).where(
            (b.node_id == node_id) & (b.end > now) & (b.end > b.start)
        )
    )
    return [HeldAtom(r, a, int(s), int(e)) for r, a, s, e in rows.all()]


async def _scalar_only(conn: AsyncConnection, node_id: str, now: int) -> set[str]:
    s = schema.scalar_bookings.c
    rows = await conn.execute(
        select(s.reservation_id).where((s.node_id == node_id) & (s.end > now) & (s.end > s.start))
    )
    return set(rows.scalars().all())


async def _forms(conn: AsyncConnection, node_id: str) -> dict[str, str]:
    """Device → the digest of its current atoms (`claims.form_of`)."""
    a = schema.atoms.c
    rows = await conn.execute(
        select(a.atom_id, a.device_id).where((a.node_id == node_id) & a.retired.is_(False))
    )
    ids: dict[str, list[str]] = {}
    for atom_id, device_id in rows.all():
        ids.setdefault(device_id or atom_id, []).append(atom_id)
    return {device: form_of(atoms) for device, atoms in ids.items()}


async def move_bookings(
    conn: AsyncConnection, old: str, new: str, pools: tuple[str, str], now: int
) -> Plan:
    """Move or end the bookings of `old` that have not ended; `pools` are the two nodes'
    pools. Returns what was done."""
    held = await _held(conn, old, now)
    a = schema.atoms.c
    new_atoms = set(
        (
            await conn.execute(select(a.atom_id).where((a.node_id == new) & a.retired.is_(False)))
        ).scalars()
    )
    found = plan(
        old, new, held, new_atoms, await _held(conn, new, now),
        same_pool=pools[0] == pools[1], also=await _scalar_only(conn, old, now),
    )  # fmt: skip
    if found.ends:
        await _end(conn, list(found.ends), now)
    if found.moves:
        await _unmark_past(conn, (old, new), now)
        await _move(conn, old, new, found, now)
    if found.moves or found.ends:
        await bump(conn, set(pools), bookings=True)
        for pool_id in sorted(set(pools)):
            await refresh_booked(conn, pool_id, now)
    return found


async def _move(conn: AsyncConnection, old: str, new: str, found: Plan, now: int) -> None:
    b, s, d, rv = (schema.bookings.c, schema.scalar_bookings.c, schema.device_claims.c,
                   schema.reservations.c)  # fmt: skip
    moved = sorted(found.moves)
    rows = [
        {"b_rid": rid, "b_old": old_atom, "b_new": new_atom}
        for rid, atoms in sorted(found.moves.items())
        for old_atom, new_atom in sorted(atoms.items())
    ]
    if rows:
        await conn.execute(
            update(schema.bookings)
            .where(
                (b.reservation_id == bindparam("b_rid"))
                & (b.node_id == old)
                & (b.atom_id == bindparam("b_old"))
            )
            .values(node_id=new, atom_id=bindparam("b_new")),
            rows,
        )
    await conn.execute(
        update(schema.scalar_bookings)
        .where((s.node_id == old) & s.reservation_id.in_(moved))
        .values(node_id=new)
    )
    old_forms, new_forms = await _forms(conn, old), await _forms(conn, new)
    claims = await conn.execute(
        select(d.claim_id, d.device, d.form, d.physical).where(
            (d.node_id == old) & d.reservation_id.in_(moved)
        )
    )
    changed = [
        {"b_id": claim_id, "b_form": new_forms.get(device, form)
         if old_forms.get(device) == form else form, "b_physical": physical}
        for claim_id, device, form, physical in claims.all()
    ]  # fmt: skip
    if changed:
        # Moved one row at a time, a reservation's claim would meet its own siblings
        # still on `old` (two MIG parts of one GPU): the cross-node check is off for the
        # moved rows while they move, and on again once all of them are on `new`.
        moving = update(schema.device_claims).where(d.claim_id == bindparam("b_id"))
        await conn.execute(moving.values(physical=False), changed)
        await conn.execute(moving.values(node_id=new, form=bindparam("b_form")), changed)
        await conn.execute(moving.values(physical=bindparam("b_physical")), changed)
    stored = await conn.execute(
        select(rv.reservation_id, rv.atoms).where(rv.reservation_id.in_(moved))
    )
    for rid, atoms in stored.all():
        mapped = found.moves[rid]
        listed = [
            a | {"nodeId": new, "atomId": mapped.get(a["atomId"], a["atomId"])}
            if a["nodeId"] == old else a
            for a in atoms
        ]  # fmt: skip
        await conn.execute(
            update(schema.reservations)
            .where(rv.reservation_id == rid)
            .values(atoms=listed, updated_at=now)
        )


async def _end(conn: AsyncConnection, ids: Sequence[str], now: int) -> None:
    rv = schema.reservations.c
    await conn.execute(
        update(schema.reservations)
        .where(rv.reservation_id.in_(list(ids)) & (rv.state == LIVE))
        .values(state="preempted", ended_at=now, updated_at=now)
    )
    await end_bookings(conn, list(ids), now)


async def _unmark_past(conn: AsyncConnection, node_ids: Sequence[str], now: int) -> None:
    """Claims that ended (now, or before) hold no time anyone can book: they need no
    comparing across nodes, and their past would otherwise meet the moved claims'."""
    d = schema.device_claims.c
    await conn.execute(
        update(schema.device_claims)
        .where(d.node_id.in_(list(node_ids)) & (d.end <= now) & d.physical)
        .values(physical=False)
    )
