"""Use time with no utilization figure (SPEC §10, issue 31).

`gpu_use.unknown_ms`: of a bucket's `used_ms`, the unit-milliseconds whose unit gave no
utilization figure (a MIG instance: NVML has none for it), so that a report says
"no figure" (null weighted hours) instead of counting that time as 0 % busy. Rows
written before hold 0: their weighted time counted unknown as 0, as it then did.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision: str | None = "0006"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    with op.batch_alter_table("gpu_use") as batch:
        batch.add_column(
            sa.Column("unknown_ms", sa.BigInteger(), nullable=False, server_default="0")
        )
