"""A node as ledger rows: the columns of its `nodes` row that its inventory and its flags
give, a new node's `atoms` rows, an existing node's atoms brought to what its inventory
shows (new, changed, retired), and a transition as a `node_events` row. `NodeWriter`
decides when each is written.
"""

from __future__ import annotations

import msgspec
from sqlalchemy import bindparam, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.domain.transitions import DeviceFlags, NodeFlags, Transition
from coordinator.ledger import schema
from shared.wire import Atom, Inventory


def inventory_values(inv: Inventory, now: int) -> dict[str, object]:
    """The node row's columns an inventory describes (not its flags)."""
    return {
        "pool_id": inv.pool_id,
        "hostname": inv.hostname,
        "boot_id": inv.boot_id,
        "labels": dict(inv.labels),
        "profile_id": inv.profile_id,
        "profile_version": inv.profile_version,
        "inventory_hash": inv.inventory_hash,
        "inventory": msgspec.to_builtins(inv),
        "last_seen": now,
        "vcpu": inv.scalars.vcpu,
        "memory_gib": inv.scalars.memory_gib,
        "hugepages_1gi": inv.scalars.hugepages_1gi,
        "updated_at": now,
    }


def new_node_row(inv: Inventory, after: NodeFlags, now: int) -> dict[str, object]:
    """A new node's row: what its inventory describes, with its first flags."""
    return inventory_values(inv, now) | {
        "node_id": inv.node_id,
        "reachable": after.reachable,
        "reachable_since": now,
        "health": after.health,
        "health_reasons": list(after.health_reasons),
        "health_since": now,
        "provisioning": after.provisioning,
        "maintenance": after.maintenance,
        "maintenance_reason": after.maintenance_reason,
        "maintenance_by": after.maintenance_by,
        "maintenance_since": now if after.maintenance else None,
        "shape_hold": after.shape_hold or None,
        "duplicate_hold": after.duplicate_hold or None,
        "created_at": now,
    }


def new_atom_row(inv: Inventory, atom: Atom, health: DeviceFlags) -> dict[str, object]:
    """A new node's atom, with its device's health."""
    return {
        "atom_id": atom.atom_id,
        "node_id": inv.node_id,
        "pool_id": inv.pool_id,
        "class": atom.cls,
        "device_id": atom.device_id,
        "attrs": dict(atom.attrs),
        "retired": False,
        "health": health.status,
        "health_reasons": list(health.reasons),
    }


def flag_values(cur: NodeFlags, after: NodeFlags, now: int) -> dict[str, object]:
    """The node row's columns that differ between its flags as stored and `after` (the
    devices' health is the atoms')."""
    values: dict[str, object] = {}
    if cur.reachable != after.reachable:
        values |= {"reachable": after.reachable, "reachable_since": now}
    if cur.health != after.health:
        values |= {"health": after.health, "health_since": now}
    if cur.health_reasons != after.health_reasons:
        values["health_reasons"] = list(after.health_reasons)
    if cur.provisioning != after.provisioning:
        values["provisioning"] = after.provisioning
    if cur.maintenance != after.maintenance:
        values |= {
            "maintenance": after.maintenance,
            "maintenance_since": now if after.maintenance else None,
        }
    if (cur.maintenance_reason, cur.maintenance_by) != (
        after.maintenance_reason,
        after.maintenance_by,
    ):
        values |= {
            "maintenance_reason": after.maintenance_reason,
            "maintenance_by": after.maintenance_by,
        }
    if cur.pending_pool != after.pending_pool:
        values["pending_pool_id"] = after.pending_pool
    if cur.shape_hold != after.shape_hold:
        values["shape_hold"] = after.shape_hold or None
    if cur.duplicate_hold != after.duplicate_hold:
        values["duplicate_hold"] = after.duplicate_hold or None
    if cur.pool_id != after.pool_id:
        values["pool_id"] = after.pool_id
    return values


async def replace_atoms(conn: AsyncConnection, inv: Inventory, pool_id: str) -> None:
    """Bring a node's atoms to what its inventory shows, in `pool_id`: new ones added,
    the others updated, those it no longer shows retired."""
    a = schema.atoms.c
    current = {
        row.atom_id
        for row in (await conn.execute(select(a.atom_id).where(a.node_id == inv.node_id))).all()
    }
    seen: set[str] = set()
    inserts: list[dict[str, object]] = []
    updates: list[dict[str, object]] = []
    for atom in inv.atoms:
        values: dict[str, object] = {
            "pool_id": pool_id,
            "class": atom.cls,
            "device_id": atom.device_id,
            "attrs": dict(atom.attrs),
            "retired": False,
        }
        seen.add(atom.atom_id)
        if atom.atom_id in current:
            updates.append({"b_atom_id": atom.atom_id, **values})
        else:
            # Healthy until `save` writes the device's health with its transition.
            inserts.append(
                {"atom_id": atom.atom_id, "node_id": inv.node_id}
                | values
                | {"health": "healthy", "health_reasons": []}
            )
    if inserts:
        await conn.execute(schema.atoms.insert(), inserts)
    if updates:
        stmt = (
            update(schema.atoms)
            .where(a.atom_id == bindparam("b_atom_id"))
            .values({k: bindparam(k) for k in updates[0] if k != "b_atom_id"})
        )
        await conn.execute(stmt, updates)
    gone = current - seen
    if gone:
        await conn.execute(update(schema.atoms).where(a.atom_id.in_(gone)).values(retired=True))


def event_row(node_id: str, pool_id: str, t: Transition, now: int) -> dict[str, object]:
    return {
        "node_id": node_id,
        "pool_id": pool_id,
        "kind": t.kind,
        "reason": t.reason,
        "by": t.by,
        "at": now,
        "device_id": t.device_id,
    }
