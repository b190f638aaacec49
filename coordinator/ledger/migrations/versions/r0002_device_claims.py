"""Truth under change: bookings claim physical devices, nodes hold a pending pool move,
reservations carry their at-risk flag.

- `device_claims`: one row per (node, device, part) each booking claims, exclusive or
  shared, with the device's form (a digest of its atom ids when booked). On PostgreSQL
  three exclusion constraints refuse overlapping claims on one device's capacity: an
  exclusive row against any row of its key, and two forms of one device.
- `nodes.pending_pool_id`: the pool an agent reported while the node held bookings.
- `reservations.at_risk`: {reason, since, atoms} while an atom is out of service.
- `ix_bookings_node_end`: a node's live bookings, read on every node change.

Live bookings (ending after the migration runs) get their claim rows from the atoms
as they stand; a booking on an atom no longer in the inventory claims it with the form
"retired", so no current form of its device overlaps it. The claim rules are copied
here, frozen, rather than imported: this revision never changes.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import hashlib
import time
from collections import defaultdict
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision: str | None = "0001"
branch_labels: str | None = None
depends_on: str | None = None

_PART_CLASSES = ("gpu.mig", "gpu.slot")
_RETIRED_FORM = "retired"
_CLAIM_COLUMNS = ("reservation_id", "node_id", "device", "part", "exclusive", "form", "start",
                  "end")  # fmt: skip


def _form(atom_ids: list[str]) -> str:
    return hashlib.sha256("\n".join(sorted(atom_ids)).encode()).hexdigest()[:32]


def _schema() -> None:
    op.create_table(
        "device_claims",
        sa.Column("claim_id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("reservation_id", sa.String(57), nullable=False),
        sa.Column("node_id", sa.String(128), nullable=False),
        sa.Column("device", sa.String(256), nullable=False),
        sa.Column("part", sa.String(256), nullable=False),
        sa.Column("exclusive", sa.Boolean(), nullable=False),
        sa.Column("form", sa.String(64), nullable=False),
        sa.Column("start", sa.BigInteger(), nullable=False),
        sa.Column("end", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("claim_id"),
    )
    op.create_index("ix_device_claims_reservation_id", "device_claims", ["reservation_id"])
    op.create_index("ix_bookings_node_end", "bookings", ["node_id", "end"])
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("pending_pool_id", sa.String(57), nullable=True))
        batch.create_index("ix_nodes_pending_pool", ["pending_pool_id"])
    with op.batch_alter_table("reservations") as batch:
        batch.add_column(sa.Column("at_risk", sa.JSON(), nullable=True))


def _claims(
    booking: Any, atom: Any, forms: dict[tuple[str, str], list[str]]
) -> list[tuple[str, str, bool, str]]:
    """(device, part, exclusive, form) rows of one booking, as `claims.claim_rows`."""
    if booking.cls == "node":
        return [("", "*", True, "node")]
    device_id = atom.device_id if atom is not None else ""
    device = device_id or booking.atom_id
    retired = atom is None or bool(atom.retired)
    form = _RETIRED_FORM if retired else _form(forms[(booking.node_id, device)])
    attrs = (atom.attrs if atom is not None else None) or {}
    part = booking.cls in _PART_CLASSES or (
        booking.cls == "nic.vf" and attrs.get("sriov") is not False and bool(device_id)
    )
    rows = [("", "*", False, "node")]
    if part:
        rows += [(device, "*", False, form), (device, booking.atom_id, True, form)]
    else:
        rows.append((device, "*", True, form))
    return rows


def _backfill() -> None:
    conn = op.get_bind()
    now = int(time.time() * 1000)
    b = sa.table(
        "bookings",
        sa.column("reservation_id", sa.String), sa.column("node_id", sa.String),
        sa.column("atom_id", sa.String), sa.column("class", sa.String),
        sa.column("start", sa.BigInteger), sa.column("end", sa.BigInteger),
    )  # fmt: skip
    a = sa.table(
        "atoms",
        sa.column("atom_id", sa.String), sa.column("node_id", sa.String),
        sa.column("device_id", sa.String), sa.column("attrs", sa.JSON),
        sa.column("retired", sa.Boolean),
    )  # fmt: skip
    live = conn.execute(
        sa.select(
            b.c.reservation_id, b.c.node_id, b.c.atom_id, b.c["class"].label("cls"),
            b.c.start, b.c.end,
        ).where((b.c.end > now) & (b.c.end > b.c.start))
    ).all()  # fmt: skip
    if not live:
        return
    nodes = sorted({row.node_id for row in live})
    atoms = {
        row.atom_id: row
        for row in conn.execute(
            sa.select(a.c.atom_id, a.c.node_id, a.c.device_id, a.c.attrs, a.c.retired).where(
                a.c.node_id.in_(nodes)
            )
        ).all()
    }
    forms: dict[tuple[str, str], list[str]] = defaultdict(list)
    for atom in atoms.values():
        if not atom.retired:
            forms[(atom.node_id, atom.device_id or atom.atom_id)].append(atom.atom_id)
    per_booking: dict[tuple[str, str], dict[tuple[str, str], tuple[bool, str, int, int]]] = (
        defaultdict(dict)
    )
    for row in live:
        held = per_booking[(row.reservation_id, row.node_id)]
        for device, part, exclusive, form in _claims(row, atoms.get(row.atom_id), forms):
            old = held.get((device, part))
            if old is None or (exclusive and not old[0]):
                held[(device, part)] = (exclusive, form, int(row.start), int(row.end))
    claims = sa.table(
        "device_claims",
        sa.column("reservation_id", sa.String), sa.column("node_id", sa.String),
        sa.column("device", sa.String), sa.column("part", sa.String),
        sa.column("exclusive", sa.Boolean), sa.column("form", sa.String),
        sa.column("start", sa.BigInteger), sa.column("end", sa.BigInteger),
    )  # fmt: skip
    conn.execute(
        claims.insert(),
        [
            dict(
                zip(
                    _CLAIM_COLUMNS,
                    (rid, node_id, device, part, exclusive, form, start, end),
                    strict=True,
                )
            )
            for (rid, node_id), held in sorted(per_booking.items())
            for (device, part), (exclusive, form, start, end) in sorted(held.items())
        ],
    )


def _constraints() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    # Not in `schema.py`: SQLAlchemy metadata does not carry exclusion constraints.
    during = 'int8range(start, "end") WITH &&'
    key = "node_id WITH =, device WITH =, part WITH ="
    op.execute(
        "ALTER TABLE device_claims ADD CONSTRAINT device_claims_exclusive "
        f"EXCLUDE USING gist ({key}, {during}) WHERE (exclusive)"
    )
    op.execute(
        "ALTER TABLE device_claims ADD CONSTRAINT device_claims_shared "
        f"EXCLUDE USING gist ({key}, exclusive WITH <>, {during})"
    )
    op.execute(
        "ALTER TABLE device_claims ADD CONSTRAINT device_claims_one_form "
        f"EXCLUDE USING gist (node_id WITH =, device WITH =, form WITH <>, {during})"
    )


def upgrade() -> None:
    _schema()
    _backfill()
    _constraints()


def downgrade() -> None:
    raise NotImplementedError("not downgraded; restore a backup instead")
