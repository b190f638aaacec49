"""At-risk interval reservations.

`interval_reservations.at_risk`: {reason, since, atoms} while the pool has promised more
memory than it has in service in a quarter the reservation holds (SPEC §5, issue 23).

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
