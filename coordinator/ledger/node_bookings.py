"""Reading what each node's agent is told it holds: the pools' version counters (which
pools moved since last read) and a pool's bookings that have not ended, with their atoms
and reservations (`coordinator.domain.node_bookings` turns them into wire values)."""

from __future__ import annotations

from sqlalchemy import select

from coordinator.domain.node_bookings import BookedRow, PoolBookings, PoolVersion
from coordinator.domain.reservation import Reservation
from coordinator.ledger import schema
from coordinator.ledger.database import Database
from coordinator.ledger.reservations import reservation_from_row


class NodeBookingRepo:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def versions(self) -> dict[str, PoolVersion]:
        """Every pool's (nodes_version, bookings_version): one small table, read whole."""
        v = schema.pool_versions.c
        async with self._db.read() as conn:
            rows = await conn.execute(select(v.pool_id, v.nodes_version, v.bookings_version))
            return {
                pool: PoolVersion(int(nodes), int(bookings)) for pool, nodes, bookings in rows.all()
            }

    async def pool(self, pool_id: str, now: int) -> PoolBookings:
        """The pool's bookings ending after `now`, and the reservations they belong to."""
        b, a, r = schema.bookings.c, schema.atoms.c, schema.reservations.c
        async with self._db.read() as conn:
            rows = (
                await conn.execute(
                    select(
                        b.reservation_id, b.node_id, b.pool_id, b.start, b.end, b.atom_id,
                        b["class"], a.device_id, a.attrs,
                    )
                    .select_from(schema.bookings.outerjoin(schema.atoms, a.atom_id == b.atom_id))
                    .where((b.pool_id == pool_id) & (b.end > now))
                )
            ).all()  # fmt: skip
            ids = sorted({row.reservation_id for row in rows})
            reservations: dict[str, Reservation] = {}
            # Chunked: a parameter list has a limit (SQLite's is 32766).
            for k in range(0, len(ids), 1000):
                found = await conn.execute(
                    select(schema.reservations).where(r.reservation_id.in_(ids[k : k + 1000]))
                )
                for res_row in found.all():
                    res = reservation_from_row(res_row)
                    reservations[res.reservation_id] = res
        booked = tuple(
            BookedRow(
                reservation_id=row.reservation_id,
                node_id=row.node_id,
                pool_id=row.pool_id,
                start=int(row.start),
                end=int(row.end),
                atom_id=row.atom_id,
                cls=row[6],
                device_id=row.device_id or "",
                attrs=dict(row.attrs or {}),
            )
            for row in rows
        )
        return PoolBookings(booked, reservations)
