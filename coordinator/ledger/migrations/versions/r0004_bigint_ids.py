"""64-bit growing ids on PostgreSQL.

The keys the database generates and that grow for the ledger's whole life were SERIAL,
32-bit: past 2^31 - 1 the next node event, booking, device claim or outbox alert could
not be written, and `nodes.events` answered `after` >= 2^31 with an error. Each column
becomes BIGINT and its sequence `AS bigint` (PostgreSQL then lifts the sequence's
maximum, which was the int4 default, to the int8 one). ALTER ... TYPE rewrites the table
and its indexes under an exclusive lock: on a large ledger the upgrade takes a while.

SQLite: nothing to do. An INTEGER PRIMARY KEY is the 64-bit rowid there, and must stay
declared INTEGER to remain it (hence `schema.GrowingId`'s SQLite variant).

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision: str | None = "0003"
branch_labels: str | None = None
depends_on: str | None = None

# Frozen here (a released revision never changes), not read from the schema module.
_GROWING = (
    ("node_events", "event_id"),
    ("bookings", "booking_id"),
    ("scalar_bookings", "booking_id"),
    ("device_claims", "claim_id"),
    ("alert_outbox", "seq"),
)


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, column in _GROWING:
        op.alter_column(
            table, column, type_=sa.BigInteger(), existing_type=sa.Integer(),
            existing_nullable=False,
        )  # fmt: skip
        # The sequence's name is whatever SERIAL gave it (numbered and Alembic installs
        # alike); ALTER SEQUENCE takes a name, not an expression, hence the DO block.
        op.execute(
            "DO $$ BEGIN EXECUTE format('ALTER SEQUENCE %s AS bigint', "
            f"pg_get_serial_sequence('{table}', '{column}')); END $$"
        )
