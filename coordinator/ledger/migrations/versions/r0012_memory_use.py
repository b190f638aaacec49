"""Memory use per tenant, pool and 15-minute interval (SPEC §13, issue 35).

`memory_use`: per quarter (its start, ms), tenant (`""`: use no live reservation owns)
and pool, the GPU memory its processes held in MiB-milliseconds (`mib_ms`) and the
largest total seen at one use pass (`peak_mib`). Written by the leader's use pass
(`coordinator.domain.consumption`), added to in place; read by the consumption API.

`gpu_use.idle_ms`: of a bucket's `used_ms`, the time its unit's utilization was under
the idle threshold, which chargeback counts as booked and not used. Rows written
before hold 0.

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision: str | None = "0011"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "memory_use",
        sa.Column("quarter", sa.BigInteger(), nullable=False),
        sa.Column("tenant_id", sa.String(128), nullable=False),
        sa.Column("pool_id", sa.String(57), nullable=False),
        sa.Column("mib_ms", sa.BigInteger(), nullable=False),
        sa.Column("peak_mib", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("quarter", "tenant_id", "pool_id"),
    )
    with op.batch_alter_table("gpu_use") as batch:
        batch.add_column(sa.Column("idle_ms", sa.BigInteger(), nullable=False, server_default="0"))
