"""The alert outbox and the leader's fencing token.

`alert_outbox`: each alert is written in the transaction that records its transition,
then published to JetStream and marked sent. `leader_term`: one row whose `epoch` a new
leader bumps; leader writes check it (see `coordinator.ledger.fence`).

Revision ID: 0003
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision: str | None = "0002"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "alert_outbox",
        sa.Column("seq", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("alert_id", sa.String(64), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("sent_at", sa.BigInteger(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("seq"),
    )
    op.create_index("ix_alert_outbox_alert_id", "alert_outbox", ["alert_id"], unique=True)
    op.create_index("ix_alert_outbox_unsent", "alert_outbox", ["sent_at", "seq"])
    leader_term = op.create_table(
        "leader_term",
        sa.Column("term_id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("holder", sa.String(256), nullable=False),
        sa.Column("since", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("term_id"),
    )
    op.bulk_insert(leader_term, [{"term_id": 1, "epoch": 0, "holder": "", "since": 0}])
