"""The ledger's tables as the simulation's checker reads them: raw rows of one
simulation's tenants and pools, read in one transaction beneath the ledger's API, so the
reference model judges what is stored, not what the ledger's own code says about it; and
a fingerprint of them that names and random ids do not change, for the replay trace."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from sqlalchemy import func, select

from coordinator.ledger import Database, schema
from shared.wire import Alert


@dataclass(frozen=True, slots=True)
class NodeRow:
    node_id: str
    pool_id: str
    reachable: bool
    health: str
    maintenance: bool
    maintenance_reason: str
    provisioning: bool
    scalars: dict[str, int]
    pending_pool: str | None  # a reported pool move held while bookings live
    # The stored inventory's GPUs as (uuid, pciBusId, nvlinkPeers): the link matrix the
    # reference reads NVLink cliques from on its own.
    gpus: tuple[tuple[str, str, tuple[str, ...]], ...] = ()


@dataclass(frozen=True, slots=True)
class AtomRow:
    atom_id: str
    node_id: str
    pool_id: str
    cls: str
    device_id: str
    attrs: dict[str, object]
    health: str
    retired: bool


@dataclass(frozen=True, slots=True)
class BookingRow:
    reservation_id: str
    tenant_id: str
    pool_id: str
    node_id: str
    atom_id: str
    cls: str
    spot: bool
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class ScalarRow:
    reservation_id: str
    tenant_id: str
    pool_id: str
    node_id: str  # "" for a pool-level (interval) booking
    resource: str
    amount: int
    start: int
    end: int
    spot: bool = False


@dataclass(frozen=True, slots=True)
class QuotaRow:
    tenant_id: str
    pool_id: str  # "" for every pool
    resource: str
    limit: int


@dataclass(frozen=True, slots=True)
class EventRow:
    node_id: str
    pool_id: str
    kind: str
    device_id: str | None
    at: int


@dataclass(frozen=True, slots=True)
class LedgerView:
    nodes: dict[str, NodeRow]
    atoms: dict[str, AtomRow]
    bookings: list[BookingRow]
    scalars: list[ScalarRow]
    rollup: dict[tuple[str, str], dict[str, int]]  # (pool, resource) → column → value
    quotas: list[QuotaRow]
    events: list[EventRow]
    # reservationId → (stored state, ended_at)
    stored: dict[str, tuple[str, int | None]]


async def read_view(
    db: Database, tenants: Iterable[str], pools: Iterable[str], *, events: bool = True
) -> LedgerView:
    tenant_ids, pool_ids = sorted(tenants), sorted(pools)
    n, a, b, s = schema.nodes.c, schema.atoms.c, schema.bookings.c, schema.scalar_bookings.c
    r, q, e, rv = schema.rollup.c, schema.quotas.c, schema.node_events.c, schema.reservations.c
    async with db.read() as conn:
        node_rows = (await conn.execute(select(schema.nodes).where(n.pool_id.in_(pool_ids)))).all()
        nodes = {
            row.node_id: NodeRow(
                row.node_id,
                row.pool_id,
                bool(row.reachable),
                row.health,
                bool(row.maintenance),
                row.maintenance_reason or "",
                bool(row.provisioning),
                {"vcpu": row.vcpu, "memoryGiB": row.memory_gib, "hugepages1Gi": row.hugepages_1gi},
                row.pending_pool_id,
                _gpus(row.inventory),
            )
            for row in node_rows
        }
        node_ids = sorted(nodes)
        atom_rows = (await conn.execute(select(schema.atoms).where(a.node_id.in_(node_ids)))).all()
        atoms = {
            row.atom_id: AtomRow(
                row.atom_id,
                row.node_id,
                row.pool_id,
                getattr(row, "class"),
                row.device_id or "",
                dict(row.attrs or {}),
                row.health,
                bool(row.retired),
            )
            for row in atom_rows
        }
        bookings = [
            BookingRow(
                row.reservation_id,
                row.tenant_id,
                row.pool_id,
                row.node_id,
                row.atom_id,
                getattr(row, "class"),
                bool(row.spot),
                int(row.start),
                int(row.end),
            )
            for row in (
                await conn.execute(select(schema.bookings).where(b.tenant_id.in_(tenant_ids)))
            ).all()
        ]
        scalars = [
            ScalarRow(
                row.reservation_id,
                row.tenant_id,
                row.pool_id,
                row.node_id,
                row.resource,
                int(row.amount),
                int(row.start),
                int(row.end),
                bool(row.spot),
            )
            for row in (
                await conn.execute(
                    select(schema.scalar_bookings).where(s.tenant_id.in_(tenant_ids))
                )
            ).all()
        ]
        rollup = {
            (row.pool_id, row.resource): {
                c: int(getattr(row, c))
                for c in (
                    "total",
                    "allocatable",
                    "allocated",
                    "reserved",
                    "available",
                    "provisioning",
                    "unhealthy",
                    "maintenance",
                    "unreachable",
                    "updated_at",
                )
            }
            for row in (
                await conn.execute(select(schema.rollup).where(r.pool_id.in_(pool_ids)))
            ).all()
        }
        quotas = [
            QuotaRow(row.tenant_id, row.pool_id, row.resource, int(row.limit))
            for row in (
                await conn.execute(select(schema.quotas).where(q.tenant_id.in_(tenant_ids)))
            ).all()
        ]
        event_rows = (
            [
                EventRow(row.node_id, row.pool_id, row.kind, row.device_id, int(row.at))
                for row in (
                    await conn.execute(
                        select(e.node_id, e.pool_id, e.kind, e.device_id, e.at)
                        .where(e.node_id.in_(node_ids))
                        .order_by(e.event_id)
                    )
                ).all()
            ]
            if events
            else []
        )
        stored = {
            row.reservation_id: (row.state, row.ended_at)
            for row in (
                await conn.execute(
                    select(rv.reservation_id, rv.state, rv.ended_at).where(
                        rv.tenant_id.in_(tenant_ids)
                    )
                )
            ).all()
        }
    return LedgerView(nodes, atoms, bookings, scalars, rollup, quotas, event_rows, stored)


def fingerprint(view: LedgerView, names: Mapping[str, str]) -> str:
    """A digest of every row in `view`, each name in `names` replaced by its stand-in
    and reservation ids left out (the ledger draws them at random): equal for two runs
    that left the same things in the ledger under other names."""

    def rows(items: Iterable[object]) -> list[str]:
        out = []
        for item in items:
            text = repr(item)
            for name, stand_in in names.items():
                text = text.replace(name, stand_in)
            out.append(text)
        return sorted(out)

    text = repr(
        (
            rows(view.nodes.values()),
            rows(view.atoms.values()),
            rows(replace(b, reservation_id="") for b in view.bookings),
            rows(replace(s, reservation_id="") for s in view.scalars),
            rows(view.rollup.items()),
            rows(view.quotas),
            rows(view.events),
            rows(view.stored.values()),
        )
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _gpus(inventory: object) -> tuple[tuple[str, str, tuple[str, ...]], ...]:
    gpus = inventory.get("gpus") if isinstance(inventory, dict) else None
    return tuple(
        (str(g["uuid"]), str(g.get("pciBusId") or ""), tuple(g.get("nvlinkPeers") or ()))
        for g in gpus or ()
        if isinstance(g, dict) and g.get("uuid")
    )


async def read_outbox(db: Database, after: int) -> list[tuple[int, Alert]]:
    """The alerts written to the outbox after row `after` (its `seq`), oldest first: what
    the relay will publish, committed with the changes they report."""
    o = schema.alert_outbox.c
    async with db.read() as conn:
        rows = (
            await conn.execute(select(o.seq, o.payload).where(o.seq > after).order_by(o.seq))
        ).all()
    return [(int(row.seq), Alert.from_json(row.payload)) for row in rows]


async def outbox_end(db: Database) -> int:
    """The `seq` of the newest outbox row (0: none)."""
    async with db.read() as conn:
        return int((await conn.execute(select(func.max(schema.alert_outbox.c.seq)))).scalar() or 0)
