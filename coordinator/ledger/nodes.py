"""Nodes and their atoms: inventory upserts, state transitions with events, last-seen.

State transitions (reachability, health, provisioning, maintenance) are written at once,
each with a node event and the pool's rollup refreshed in the same transaction. Plain
liveness (last-seen) arrives in batches from the ingest flusher: one statement for many
heartbeats.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sqlalchemy import bindparam, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.errors import NotFound
from coordinator.ledger import schema
from coordinator.ledger.database import Database
from coordinator.ledger.rollups import NodeChange
from shared.wire import DeviceHealth, HealthStatus, Inventory


class UnknownPool(NotFound):
    """An agent reported a pool the ledger does not know."""


@dataclass(frozen=True, slots=True)
class InventoryOutcome:
    node_id: str
    pool_id: str
    created: bool
    events: tuple[tuple[str, str], ...]  # (kind, reason)


async def add_event(
    conn: AsyncConnection,
    node_id: str,
    pool_id: str,
    kind: str,
    reason: str,
    at: int,
    by: str = "coordinator",
    device_id: str | None = None,
) -> None:
    await conn.execute(
        schema.node_events.insert().values(
            node_id=node_id,
            pool_id=pool_id,
            kind=kind,
            reason=reason,
            by=by,
            at=at,
            device_id=device_id,
        )
    )


def _devices_map(devices: Iterable[DeviceHealth]) -> dict[str, DeviceHealth]:
    return {d.device_id: d for d in devices}


class NodeRepo:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def apply_inventory(self, inv: Inventory, now: int) -> InventoryOutcome:
        """Record a full inventory: node row, atoms (new, changed, retired), device health."""
        n = schema.nodes.c
        events: list[tuple[str, str]] = []
        async with self._db.transaction() as conn:
            pool = (
                await conn.execute(
                    select(schema.pools.c.pool_id).where(schema.pools.c.pool_id == inv.pool_id)
                )
            ).first()
            if pool is None:
                raise UnknownPool(f"unknown pool {inv.pool_id}")
            change = await NodeChange.begin(conn, [inv.node_id])
            existing = (
                await conn.execute(select(schema.nodes).where(n.node_id == inv.node_id))
            ).first()
            values: dict[str, object] = {
                "pool_id": inv.pool_id,
                "hostname": inv.hostname,
                "boot_id": inv.boot_id,
                "labels": dict(inv.labels),
                "profile_id": inv.profile_id,
                "profile_version": inv.profile_version,
                "inventory_hash": inv.inventory_hash,
                "inventory": inv.model_dump(mode="json", by_alias=True),
                "last_seen": now,
                "provisioning": inv.provisioning,
                "vcpu": inv.scalars.vcpu,
                "memory_gib": inv.scalars.memory_gib,
                "hugepages_1gi": inv.scalars.hugepages_1gi,
                "updated_at": now,
            }
            if existing is None:
                await conn.execute(
                    schema.nodes.insert().values(
                        node_id=inv.node_id,
                        reachable=True,
                        reachable_since=now,
                        health=inv.health.status,
                        health_reasons=list(inv.health.reasons),
                        health_since=now,
                        maintenance=False,
                        maintenance_reason="",
                        maintenance_by="",
                        created_at=now,
                        **values,
                    )
                )
                events.append(("node.registered", f"first inventory from {inv.hostname}"))
            else:
                if existing.pool_id != inv.pool_id:
                    events.append(("node.moved", f"from {existing.pool_id}"))
                # Reachability is the liveness tracker's call (with hysteresis), not ours.
                if existing.health != inv.health.status:
                    values |= {"health": inv.health.status, "health_since": now}
                    events.append((f"node.{inv.health.status}", "; ".join(inv.health.reasons)))
                values["health_reasons"] = list(inv.health.reasons)
                if bool(existing.provisioning) != inv.provisioning:
                    events.append(
                        ("node.provisioning" if inv.provisioning else "node.provisioned", "")
                    )
                await conn.execute(
                    update(schema.nodes).where(n.node_id == inv.node_id).values(**values)
                )
            await self._replace_atoms(conn, inv)
            for kind, reason in events:
                await add_event(conn, inv.node_id, inv.pool_id, kind, reason, now)
            await change.settle(now)
        return InventoryOutcome(inv.node_id, inv.pool_id, existing is None, tuple(events))

    async def _replace_atoms(self, conn: AsyncConnection, inv: Inventory) -> None:
        a = schema.atoms.c
        devices = _devices_map(inv.devices)
        current = {
            row.atom_id
            for row in (await conn.execute(select(a.atom_id).where(a.node_id == inv.node_id))).all()
        }
        seen: set[str] = set()
        inserts: list[dict[str, object]] = []
        updates: list[dict[str, object]] = []
        for atom in inv.atoms:
            dev = devices.get(atom.device_id) if atom.device_id else None
            values: dict[str, object] = {
                "pool_id": inv.pool_id,
                "class": atom.cls,
                "device_id": atom.device_id,
                "attrs": dict(atom.attrs),
                "health": dev.status if dev else "healthy",
                "health_reasons": list(dev.reasons) if dev else [],
                "retired": False,
            }
            seen.add(atom.atom_id)
            if atom.atom_id in current:
                updates.append({"b_atom_id": atom.atom_id, **values})
            else:
                inserts.append({"atom_id": atom.atom_id, "node_id": inv.node_id, **values})
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

    async def apply_health(
        self,
        node_id: str,
        health: HealthStatus,
        reasons: Sequence[str],
        devices: Sequence[DeviceHealth],
        provisioning: bool,
        now: int,
    ) -> list[tuple[str, str, str | None]]:
        """Write a heartbeat's health when it differs from the ledger. Returns the
        transitions as (kind, reason, deviceId) so the caller can publish alerts."""
        n, a = schema.nodes.c, schema.atoms.c
        out: list[tuple[str, str, str | None]] = []
        async with self._db.transaction() as conn:
            node = (await conn.execute(select(schema.nodes).where(n.node_id == node_id))).first()
            if node is None:
                return out
            change = await NodeChange.begin(conn, [node_id])
            values: dict[str, object] = {"health_reasons": list(reasons), "updated_at": now}
            if node.health != health:
                values |= {"health": health, "health_since": now}
                out.append(
                    (
                        f"node.{'healthy' if health == 'healthy' else health}",
                        "; ".join(reasons),
                        None,
                    )
                )
            if bool(node.provisioning) != provisioning:
                values["provisioning"] = provisioning
                out.append(("node.provisioning" if provisioning else "node.provisioned", "", None))
            await conn.execute(update(schema.nodes).where(n.node_id == node_id).values(**values))
            want = _devices_map(devices)
            rows = (
                await conn.execute(
                    select(a.atom_id, a.device_id, a.health).where(
                        (a.node_id == node_id) & (a.retired.is_(False)) & (a.device_id != "")
                    )
                )
            ).all()
            changed_devices: dict[str, tuple[str, list[str]]] = {}
            for row in rows:
                dev = want.get(row.device_id)
                dev_status = dev.status if dev else "healthy"
                if dev_status != row.health:
                    changed_devices[row.device_id] = (dev_status, list(dev.reasons) if dev else [])
            for dev_id, (new_status, dev_reasons) in changed_devices.items():
                await conn.execute(
                    update(schema.atoms)
                    .where((a.node_id == node_id) & (a.device_id == dev_id))
                    .values(health=new_status, health_reasons=dev_reasons)
                )
                faulty = new_status in ("unhealthy", "unmonitored")
                kind = "device.unhealthy" if faulty else "device.healthy"
                out.append((kind, "; ".join(dev_reasons), dev_id))
            for ev_kind, ev_reason, ev_device in out:
                await add_event(
                    conn, node_id, node.pool_id, ev_kind, ev_reason, now, device_id=ev_device
                )
            if out:
                await change.settle(now)
        return out

    async def set_reachable(
        self, node_ids: Iterable[str], reachable: bool, reason: str, now: int
    ) -> list[tuple[str, str]]:
        """Flip reachability for nodes whose flag differs; returns (nodeId, poolId) flipped."""
        n = schema.nodes.c
        ids = list(node_ids)
        if not ids:
            return []
        flipped: list[tuple[str, str]] = []
        async with self._db.transaction() as conn:
            rows = (
                await conn.execute(
                    select(n.node_id, n.pool_id).where(
                        n.node_id.in_(ids) & (n.reachable.is_(not reachable))
                    )
                )
            ).all()
            if not rows:
                return []
            flipped = [(r.node_id, r.pool_id) for r in rows]
            change = await NodeChange.begin(conn, [f[0] for f in flipped])
            await conn.execute(
                update(schema.nodes)
                .where(n.node_id.in_([f[0] for f in flipped]))
                .values(reachable=reachable, reachable_since=now, updated_at=now)
            )
            kind = "node.reachable" if reachable else "node.unreachable"
            for node_id, pool_id in flipped:
                await add_event(conn, node_id, pool_id, kind, reason, now)
            await change.settle(now)
        return flipped

    async def set_maintenance(
        self, node_id: str, on: bool, reason: str, by: str, now: int
    ) -> tuple[str, bool]:
        """Put a node in or out of maintenance; returns (poolId, changed)."""
        n = schema.nodes.c
        async with self._db.transaction() as conn:
            node = (
                await conn.execute(select(n.pool_id, n.maintenance).where(n.node_id == node_id))
            ).first()
            if node is None:
                raise NotFound(f"node {node_id} not found")
            if bool(node.maintenance) == on:
                return node.pool_id, False
            change = await NodeChange.begin(conn, [node_id])
            await conn.execute(
                update(schema.nodes)
                .where(n.node_id == node_id)
                .values(
                    maintenance=on,
                    maintenance_reason=reason if on else "",
                    maintenance_by=by if on else "",
                    maintenance_since=now if on else None,
                    updated_at=now,
                )
            )
            kind = "node.maintenance" if on else "node.maintenance_ended"
            await add_event(conn, node_id, node.pool_id, kind, reason, now, by=by)
            await change.settle(now)
        return node.pool_id, True

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

    async def liveness_snapshot(self) -> list[tuple[str, str, int, int, bool, str, str]]:
        """(nodeId, poolId, lastSeen, intervalMs, reachable, health, inventoryHash) for all."""
        n = schema.nodes.c
        async with self._db.read() as conn:
            rows = await conn.execute(
                select(
                    n.node_id, n.pool_id, n.last_seen, n.interval_ms, n.reachable, n.health,
                    n.inventory_hash,
                )
            )  # fmt: skip
            return [tuple(r) for r in rows.all()]
