"""Use of GPUs over time (SPEC §10, issue 24).

`gpu_use`: per hour, reservation (`""`: use no booking covered), node and unit (a GPU's
or MIG instance's UUID), the unit-milliseconds it had a process (`used_ms`) and those
weighted by its utilization (`weighted_ms`), with the tenant, pool, project and booked
class (`resource`) the report groups by. Written by the leader's use pass
(`coordinator.domain.gpu_use_accrual`), added to in place.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision: str | None = "0005"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "gpu_use",
        sa.Column("hour", sa.BigInteger(), nullable=False),
        sa.Column("reservation_id", sa.String(57), nullable=False),
        sa.Column("node_id", sa.String(128), nullable=False),
        sa.Column("unit", sa.String(128), nullable=False),
        sa.Column("resource", sa.String(16), nullable=False),
        sa.Column("tenant_id", sa.String(128), nullable=False),
        sa.Column("pool_id", sa.String(57), nullable=False),
        sa.Column("project_id", sa.String(56), nullable=True),
        sa.Column("used_ms", sa.BigInteger(), nullable=False),
        sa.Column("weighted_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("hour", "reservation_id", "node_id", "unit", "resource"),
    )
    op.create_index("ix_gpu_use_reservation", "gpu_use", ["reservation_id"])
