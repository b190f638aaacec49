"""Projects (SPEC §1 "Project", issue 34).

`projects`: a tenant's own grouping of reservations, `prj_` + ULID, issued by
`projects.create` with a name unique within the tenant. Reservations keep naming their
project by id, as before; ids given before this revision are still accepted.

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision: str | None = "0009"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "projects",
        sa.Column("project_id", sa.String(56), nullable=False),
        sa.Column("tenant_id", sa.String(128), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.tenant_id"]),
        sa.PrimaryKeyConstraint("project_id"),
        sa.UniqueConstraint("tenant_id", "name", name="uq_projects_tenant_name"),
    )
