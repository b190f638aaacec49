"""PostgreSQL's double-booking constraints compare 64-bit hashes, not text (issue 30
point 8).

The five exclusion constraints (`bookings_no_overlap`; `device_claims_exclusive`,
`_shared`, `_one_form`, `_physical`) are the database's own refusal of two promises of
one capacity, whatever the coordinators do. Their gist indexes held the node, device,
part and atom ids as text, and a booking's rows paid for it: of a 32-client create run
at 1,000 nodes, 55 % of the wall time was the inserts into these two tables. Measured on
1,536 claim rows in one statement: 8 ms with no constraint, 180–260 ms with the four,
about 90 ms once their equality parts are hashed.

Each `WITH =` on ids becomes one `WITH =` on a chained `hashtextextended` of them (each
id the seed of the next, so no separator can make two different tuples one string).
Equal ids always hash equal, so every overlap the old constraint refused is still
refused; two different tuples with one hash (about one chance in 2^64 per pair that also
overlaps in time) would be refused too — a spurious refusal, never a double booking.
The `WITH <>` parts (another node for a physical device, another form of a device) stay
on the real values: there a collision would let a conflict through. The names stay, so
what reports a refused write by its constraint is unchanged. SQLite has no exclusion
constraints (one writer; triggers for physical devices): nothing to do there.

Revision ID: 0016
Revises: 0015
"""

from __future__ import annotations

from alembic import op

revision = "0016"
down_revision: str | None = "0015"
branch_labels: str | None = None
depends_on: str | None = None

DURING = 'int8range(start, "end") WITH &&'
NODE_DEVICE = "hashtextextended(device, hashtextextended(node_id, 0))"
NODE_DEVICE_PART = f"hashtextextended(part, {NODE_DEVICE})"

# Frozen here (a released revision never changes): table, name, definition.
CONSTRAINTS = (
    (
        "bookings",
        "bookings_no_overlap",
        f"EXCLUDE USING gist (hashtextextended(atom_id, 0) WITH =, {DURING})",
    ),
    (
        "device_claims",
        "device_claims_exclusive",
        f"EXCLUDE USING gist ({NODE_DEVICE_PART} WITH =, {DURING}) WHERE (exclusive)",
    ),
    (
        "device_claims",
        "device_claims_shared",
        f"EXCLUDE USING gist ({NODE_DEVICE_PART} WITH =, exclusive WITH <>, {DURING})",
    ),
    (
        "device_claims",
        "device_claims_one_form",
        f"EXCLUDE USING gist ({NODE_DEVICE} WITH =, form WITH <>, {DURING}) WHERE (device <> '')",
    ),
    (
        "device_claims",
        "device_claims_physical",
        f"EXCLUDE USING gist (hashtextextended(device, 0) WITH =, node_id WITH <>, {DURING})"
        " WHERE (physical)",
    ),
)


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, name, definition in CONSTRAINTS:
        op.execute(f"ALTER TABLE {table} DROP CONSTRAINT {name}")
        op.execute(f"ALTER TABLE {table} ADD CONSTRAINT {name} {definition}")


def downgrade() -> None:
    raise NotImplementedError("not downgraded; restore a backup instead")
