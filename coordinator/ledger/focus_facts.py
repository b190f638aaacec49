"""The FOCUS export's reads beyond consumption (SPEC §13, issue 35): which interval
reservations make up a tenant's memory commitment in a quarter, which atoms (and nodes)
a device reservation booked, and the labels of a pool's nodes. Reads only."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from sqlalchemy import select

from coordinator.domain.focus import ReservedShare
from coordinator.ledger import schema
from coordinator.ledger.database import Database
from coordinator.ledger.memory_use import interval_booked

# (quarter, tenant, pool) → its interval reservations, oldest first
Commitments = dict[tuple[int, str, str], list[ReservedShare]]


@dataclass(frozen=True, slots=True)
class BookedAtom:
    """An atom a device reservation booked: its class, node and attributes."""

    cls: str
    node_id: str
    attrs: dict[str, object]


class FocusFacts:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def commitments(
        self, start: int, end: int, tenant_id: str | None = None, pool_id: str | None = None
    ) -> Commitments:
        """The interval reservations of each quarter of [start, end), per tenant and pool,
        in the order they were made (created_at, then id)."""
        s, iv = schema.scalar_bookings.c, schema.interval_reservations.c
        query = (
            select(s.start, s.tenant_id, s.pool_id, s.reservation_id, s.amount)
            .select_from(
                schema.scalar_bookings.join(
                    schema.interval_reservations, iv.reservation_id == s.reservation_id
                )
            )
            .where(interval_booked(start, end, tenant_id, pool_id))
            .order_by(s.start, s.tenant_id, s.pool_id, iv.created_at, s.reservation_id)
        )
        out: Commitments = {}
        async with self._db.read() as conn:
            for r in (await conn.execute(query)).all():
                key = (int(r.start), r.tenant_id, r.pool_id)
                out.setdefault(key, []).append(ReservedShare(r.reservation_id, int(r.amount)))
        return out

    async def booked_atoms(self, reservation_ids: Collection[str]) -> dict[str, list[BookedAtom]]:
        """Per reservation: every atom it booked."""
        b, a = schema.bookings.c, schema.atoms.c
        out: dict[str, list[BookedAtom]] = {}
        ids = sorted(set(reservation_ids))
        seen: set[tuple[str, str]] = set()
        async with self._db.read() as conn:
            for k in range(0, len(ids), 500):
                query = (
                    select(b.reservation_id, b.atom_id, b["class"].label("cls"), b.node_id, a.attrs)
                    .select_from(schema.bookings.outerjoin(schema.atoms, a.atom_id == b.atom_id))
                    .where(b.reservation_id.in_(ids[k : k + 500]))
                )
                for r in (await conn.execute(query)).all():
                    if (r.reservation_id, r.atom_id) in seen:  # booked again (an extension)
                        continue
                    seen.add((r.reservation_id, r.atom_id))
                    out.setdefault(r.reservation_id, []).append(
                        BookedAtom(r.cls, r.node_id, dict(r.attrs or {}))
                    )
        return out

    async def node_labels(self, pool_ids: Collection[str]) -> dict[str, dict[str, dict[str, str]]]:
        """Per pool: each node's labels."""
        n = schema.nodes.c
        out: dict[str, dict[str, dict[str, str]]] = {p: {} for p in pool_ids}
        if not pool_ids:
            return out
        async with self._db.read() as conn:
            rows = await conn.execute(
                select(n.pool_id, n.node_id, n.labels).where(n.pool_id.in_(sorted(pool_ids)))
            )
            for r in rows.all():
                labels = r.labels if isinstance(r.labels, dict) else {}
                out[r.pool_id][r.node_id] = {str(k): str(v) for k, v in labels.items()}
        return out
