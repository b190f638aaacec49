"""Use conditions said and not yet ended (issue 34).

`use_conditions`: one row per `gpu.unbookedUse`, `gpu.foreignUse` or `reservation.idle`
the leader said and has not ended (`coordinator.domain.gpu_use_conditions`), written
with the alerts that open and close them, so a new leader neither says them again nor
misses their end.

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision: str | None = "0010"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "use_conditions",
        sa.Column("key", sa.String(640), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("pool_id", sa.String(57), nullable=False),
        sa.Column("node_id", sa.String(128), nullable=False),
        sa.Column("device_id", sa.String(128), nullable=False),
        sa.Column("owner_kind", sa.String(16), nullable=False),
        sa.Column("owner", sa.String(256), nullable=False),
        sa.Column("reservation_id", sa.String(57), nullable=False),
        sa.Column("tenant_id", sa.String(128), nullable=False),
        sa.Column("since", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("key"),
    )


def downgrade() -> None:
    op.drop_table("use_conditions")
