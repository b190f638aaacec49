"""At-risk interval reservations; expected node shapes.

`interval_reservations.at_risk`: {reason, since, atoms} while the pool has promised more
memory than it has in service in a quarter the reservation holds (SPEC §5, issue 23).
`expected_shapes`: atom counts per class an operator expects of a pool's nodes or of a
host profile version's; `nodes.shape_hold` (why a node is held in provisioning for
exceeding one) and `nodes.accepted_shape` (the counts an operator accepted).

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision: str | None = "0004"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    with op.batch_alter_table("interval_reservations") as batch:
        batch.add_column(sa.Column("at_risk", sa.JSON(), nullable=True))
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("shape_hold", sa.Text(), nullable=True))
        batch.add_column(sa.Column("accepted_shape", sa.JSON(), nullable=True))
    op.create_table(
        "expected_shapes",
        sa.Column("pool_id", sa.String(57), nullable=False),
        sa.Column("profile_id", sa.String(128), nullable=False),
        sa.Column("profile_version", sa.Integer(), nullable=False),
        sa.Column("counts", sa.JSON(), nullable=False),
        sa.Column("updated_at", sa.BigInteger(), nullable=False),
        sa.Column("updated_by", sa.String(256), nullable=False),
        sa.PrimaryKeyConstraint("pool_id", "profile_id", "profile_version"),
    )
