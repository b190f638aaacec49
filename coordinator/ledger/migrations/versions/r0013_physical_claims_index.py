"""An index for SQLite's physical-claim trigger (issue 30 point 8).

Revision 0008's trigger refuses a GPU/MIG/disk claim when another node claims the same
physical device for overlapping time: `EXISTS (SELECT 1 FROM device_claims c WHERE
c.device = NEW.device AND c.node_id <> NEW.node_id AND c.physical AND …)`. SQLite had no
index on `device`, so every claim row read the whole table, which grows with every
booking: 1,172 ms of a 1,530 ms run of 256 creates (32 clients, 1,000 nodes half
booked). With this partial index the same inserts took 7–55 ms. What the trigger
refuses is unchanged. PostgreSQL gets the same partial index so that one schema serves
both (its exclusion constraint `device_claims_physical` checks through its own gist
index).

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision: str | None = "0012"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_index(
        "ix_device_claims_physical",
        "device_claims",
        ["device", "start"],
        sqlite_where=sa.text("physical"),
        postgresql_where=sa.text("physical"),
    )


def downgrade() -> None:
    raise NotImplementedError("not downgraded; restore a backup instead")
