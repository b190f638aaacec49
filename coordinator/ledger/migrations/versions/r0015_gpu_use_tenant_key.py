"""Each tenant's unbooked GPU time its own bucket (SPEC §13, issue 35).

`gpu_use` was keyed by hour, reservation, node, unit and class. Unbooked use (reservation
`""`) is charged to the tenant its processes' owners belong to, but with no tenant in the
key an unbooked GPU had one bucket per hour: when a second tenant's process took the GPU
within the hour, the use pass's upsert added its time to the first tenant's row, so the
first tenant was charged for both and the second for nothing. The tenant joins the key.
A booked bucket's tenant is its reservation's, so booked rows key as before; rows
already written are kept as they are (their hours cannot be split after the fact).

PostgreSQL swaps the primary key in place; SQLite copies the table (batch mode) into
the table as it now stands, declared here: reflecting the old one and adding a key
would leave its columns flagged with the old key.

Revision ID: 0015
Revises: 0013
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
# The 0013 revision for now; re-chained after 0014 where both land together.
down_revision: str | None = "0013"
branch_labels: str | None = None
depends_on: str | None = None

# Frozen here (a released revision never changes), not read from the schema module.
_KEY = ["hour", "reservation_id", "node_id", "unit", "resource", "tenant_id"]
_NAME = "gpu_use_pkey"  # PostgreSQL's own name for the key 0006 made; SQLite's now too


def _keyed() -> sa.Table:
    """`gpu_use` as 0006, 0007 and 0012 left it, with the new key."""
    big = sa.BigInteger
    return sa.Table(
        "gpu_use",
        sa.MetaData(),
        sa.Column("hour", big(), nullable=False),
        sa.Column("reservation_id", sa.String(57), nullable=False),
        sa.Column("node_id", sa.String(128), nullable=False),
        sa.Column("unit", sa.String(128), nullable=False),
        sa.Column("resource", sa.String(16), nullable=False),
        sa.Column("tenant_id", sa.String(128), nullable=False),
        sa.Column("pool_id", sa.String(57), nullable=False),
        sa.Column("project_id", sa.String(56), nullable=True),
        sa.Column("used_ms", big(), nullable=False),
        sa.Column("weighted_ms", big(), nullable=False),
        sa.Column("unknown_ms", big(), nullable=False, server_default="0"),
        sa.Column("idle_ms", big(), nullable=False, server_default="0"),
        sa.PrimaryKeyConstraint(*_KEY, name=_NAME),
        sa.Index("ix_gpu_use_reservation", "reservation_id"),
    )


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.drop_constraint(_NAME, "gpu_use", type_="primary")
        op.create_primary_key(_NAME, "gpu_use", _KEY)
        return
    with op.batch_alter_table("gpu_use", recreate="always", copy_from=_keyed()):
        pass  # the copy is the change


def downgrade() -> None:
    raise NotImplementedError("not downgraded; restore a backup instead")
