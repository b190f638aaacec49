"""The claim rows of bookings (`schema.device_claims`): what each booking holds on its
physical devices, in the form the database can check (`coordinator.domain.claims`).

On PostgreSQL the table's exclusion constraints refuse a row that overlaps another on
the same device's capacity, whatever wrote it; the booking writer then raises through
the unit of work as `WriteRaced`. SQLite has one writer at a time and relies on the
placer, which reads the same rule from the snapshot.

Claims on a device that is one device wherever it shows (`physical`: a GPU UUID, a disk
WWN or serial) are also compared across node ids (issue 31): one host registered under
two ids must not be promised twice. PostgreSQL refuses such a pair with an exclusion
constraint, SQLite with a trigger (revision 0008); either surfaces as `WriteRaced`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.domain.claims import ClaimRow, claim_rows, merged_rows
from coordinator.domain.physical_ids import is_physical_device
from coordinator.domain.placement_model import AtomSlot, NodeSlot
from coordinator.ledger import schema
from coordinator.ledger.bulk import insert_many


def rows_for(node: NodeSlot, atoms: Iterable[AtomSlot]) -> list[ClaimRow]:
    """The claim rows of booking `atoms` (current atoms of `node`)."""
    rows: list[ClaimRow] = []
    for atom in atoms:
        claim = atom.claim
        rows.extend(claim_rows(claim, node.form(claim.device or "")))
    return merged_rows(rows)


def claim_values(
    reservation_id: str, start: int, end: int, per_node: Mapping[str, Iterable[ClaimRow]]
) -> list[dict[str, object]]:
    """The table rows of one reservation's claim rows, nodeId → its rows on that node."""
    return [
        {
            "reservation_id": reservation_id,
            "node_id": node_id,
            "device": row.device,
            "part": row.part,
            "exclusive": row.exclusive,
            "form": row.form,
            "physical": is_physical_device(row.device),
            "start": start,
            "end": end,
        }
        for node_id, rows in sorted(per_node.items())
        for row in rows
    ]


async def write_claims(conn: AsyncConnection, values: list[dict[str, object]]) -> None:
    """Write claim rows (of one reservation or of a batch of them) in one statement."""
    await insert_many(conn, schema.device_claims, values)


async def insert_claims(
    conn: AsyncConnection,
    reservation_id: str,
    start: int,
    end: int,
    per_node: Mapping[str, Iterable[ClaimRow]],
) -> None:
    """Write one reservation's claim rows, nodeId → its rows on that node."""
    await write_claims(conn, claim_values(reservation_id, start, end, per_node))
