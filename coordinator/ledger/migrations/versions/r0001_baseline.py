"""Baseline: the ledger as the numbered migrations v1..v5 left it.

Explicit DDL, frozen: this file never follows `schema.py`; later changes are new
revisions. The five parts keep the old step boundaries so that a database made by the
numbered migrations at an older step can be brought to the baseline part by part
(`LEGACY_STEPS`, used by the runner) before it is stamped.

Revision ID: 0001
Revises: (none)
"""

from __future__ import annotations

from collections.abc import Callable

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None


def _v1_initial() -> None:
    op.create_table(
        "gpufleet_schema_version",
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("applied_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("version"),
    )
    op.create_table(
        "node_events",
        sa.Column("event_id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("node_id", sa.String(128), nullable=False),
        sa.Column("pool_id", sa.String(57), nullable=False),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("by", sa.String(128), nullable=False),
        sa.Column("at", sa.BigInteger(), nullable=False),
        sa.Column("device_id", sa.String(128), nullable=True),
        sa.PrimaryKeyConstraint("event_id"),
    )
    op.create_index("ix_node_events_node", "node_events", ["node_id", "event_id"])
    op.create_table(
        "rollup",
        sa.Column("pool_id", sa.String(57), nullable=False),
        sa.Column("resource", sa.String(32), nullable=False),
        *(
            sa.Column(name, sa.BigInteger(), nullable=False)
            for name in (
                "total",
                "allocatable",
                "allocated",
                "reserved",
                "available",
                "provisioning",
                "unhealthy",
                "maintenance",
                "unreachable",
                "updated_at",
            )
        ),
        sa.PrimaryKeyConstraint("pool_id", "resource"),
    )
    op.create_table(
        "tenants",
        sa.Column("tenant_id", sa.String(128), nullable=False),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id"),
    )
    op.create_table(
        "api_keys",
        sa.Column("key_id", sa.String(32), nullable=False),
        sa.Column("tenant_id", sa.String(128), nullable=False),
        sa.Column("key_hash", sa.String(64), nullable=False),
        sa.Column("roles", sa.String(256), nullable=False),
        sa.Column("label", sa.String(256), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("revoked_at", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("key_id"),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.tenant_id"]),
    )
    op.create_table(
        "pools",
        sa.Column("pool_id", sa.String(57), nullable=False),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("owner", sa.String(128), nullable=False),
        sa.Column("gpu_model", sa.String(256), nullable=True),
        sa.Column("archived", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("pool_id"),
        sa.ForeignKeyConstraint(["owner"], ["tenants.tenant_id"]),
    )
    op.create_table(
        "nodes",
        sa.Column("node_id", sa.String(128), nullable=False),
        sa.Column("pool_id", sa.String(57), nullable=False),
        sa.Column("hostname", sa.String(256), nullable=False),
        sa.Column("boot_id", sa.String(64), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("profile_id", sa.String(128), nullable=True),
        sa.Column("profile_version", sa.Integer(), nullable=True),
        sa.Column("inventory_hash", sa.String(128), nullable=False),
        sa.Column("inventory", sa.JSON(), nullable=True),
        sa.Column("interval_ms", sa.Integer(), nullable=False),
        sa.Column("last_seen", sa.BigInteger(), nullable=False),
        sa.Column("reachable", sa.Boolean(), nullable=False),
        sa.Column("reachable_since", sa.BigInteger(), nullable=False),
        sa.Column("health", sa.String(16), nullable=False),
        sa.Column("health_reasons", sa.JSON(), nullable=False),
        sa.Column("health_since", sa.BigInteger(), nullable=False),
        sa.Column("maintenance", sa.Boolean(), nullable=False),
        sa.Column("maintenance_reason", sa.Text(), nullable=False),
        sa.Column("maintenance_by", sa.String(128), nullable=False),
        sa.Column("maintenance_since", sa.BigInteger(), nullable=True),
        sa.Column("provisioning", sa.Boolean(), nullable=False),
        sa.Column("vcpu", sa.Integer(), nullable=False),
        sa.Column("memory_gib", sa.Integer(), nullable=False),
        sa.Column("hugepages_1gi", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("node_id"),
        sa.ForeignKeyConstraint(["pool_id"], ["pools.pool_id"]),
    )
    op.create_index("ix_nodes_pool_id", "nodes", ["pool_id"])
    op.create_table(
        "pool_offers",
        sa.Column("pool_id", sa.String(57), nullable=False),
        sa.Column("tenant_id", sa.String(128), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("pool_id", "tenant_id"),
        sa.ForeignKeyConstraint(["pool_id"], ["pools.pool_id"]),
    )
    op.create_table(
        "atoms",
        sa.Column("atom_id", sa.String(256), nullable=False),
        sa.Column("node_id", sa.String(128), nullable=False),
        sa.Column("pool_id", sa.String(57), nullable=False),
        sa.Column("class", sa.String(16), nullable=False),
        sa.Column("device_id", sa.String(128), nullable=False),
        sa.Column("attrs", sa.JSON(), nullable=False),
        sa.Column("health", sa.String(16), nullable=False),
        sa.Column("health_reasons", sa.JSON(), nullable=False),
        sa.Column("retired", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("atom_id"),
        sa.ForeignKeyConstraint(["node_id"], ["nodes.node_id"]),
    )
    op.create_index("ix_atoms_node", "atoms", ["node_id"])
    op.create_index("ix_atoms_pool", "atoms", ["pool_id"])


def _v2_quotas() -> None:
    op.create_table(
        "quotas",
        sa.Column("tenant_id", sa.String(128), nullable=False),
        sa.Column("pool_id", sa.String(57), nullable=False),
        sa.Column("resource", sa.String(32), nullable=False),
        sa.Column("limit", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "pool_id", "resource"),
    )


def _v3_reservations() -> None:
    op.create_table(
        "reservations",
        sa.Column("reservation_id", sa.String(57), nullable=False),
        sa.Column("tenant_id", sa.String(128), nullable=False),
        sa.Column("pool_id", sa.String(57), nullable=False),
        sa.Column("project_id", sa.String(56), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("spot", sa.Boolean(), nullable=False),
        sa.Column("binding", sa.String(8), nullable=False),
        sa.Column("start", sa.BigInteger(), nullable=False),
        sa.Column("end", sa.BigInteger(), nullable=False),
        sa.Column("lease_seconds", sa.Integer(), nullable=True),
        sa.Column("lease_expires_at", sa.BigInteger(), nullable=True),
        sa.Column("preempt_at", sa.BigInteger(), nullable=True),
        sa.Column("resources", sa.JSON(), nullable=False),
        sa.Column("gang", sa.JSON(), nullable=True),
        sa.Column("atoms", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.BigInteger(), nullable=False),
        sa.Column("ended_at", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("reservation_id"),
    )
    op.create_index("ix_reservations_live", "reservations", ["state", "lease_expires_at"])
    op.create_index(
        "ix_reservations_tenant", "reservations", ["tenant_id", "created_at", "reservation_id"]
    )
    op.create_table(
        "bookings",
        sa.Column("booking_id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("reservation_id", sa.String(57), nullable=False),
        sa.Column("tenant_id", sa.String(128), nullable=False),
        sa.Column("pool_id", sa.String(57), nullable=False),
        sa.Column("node_id", sa.String(128), nullable=False),
        sa.Column("atom_id", sa.String(256), nullable=False),
        sa.Column("class", sa.String(16), nullable=False),
        sa.Column("spot", sa.Boolean(), nullable=False),
        sa.Column("start", sa.BigInteger(), nullable=False),
        sa.Column("end", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("booking_id"),
    )
    op.create_index("ix_bookings_atom", "bookings", ["atom_id", "start"])
    op.create_index("ix_bookings_pool_end", "bookings", ["pool_id", "end"])
    op.create_index("ix_bookings_reservation_id", "bookings", ["reservation_id"])
    op.create_table(
        "scalar_bookings",
        sa.Column("booking_id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("reservation_id", sa.String(57), nullable=False),
        sa.Column("tenant_id", sa.String(128), nullable=False),
        sa.Column("pool_id", sa.String(57), nullable=False),
        sa.Column("node_id", sa.String(128), nullable=False),
        sa.Column("resource", sa.String(32), nullable=False),
        sa.Column("amount", sa.BigInteger(), nullable=False),
        sa.Column("spot", sa.Boolean(), nullable=False),
        sa.Column("start", sa.BigInteger(), nullable=False),
        sa.Column("end", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("booking_id"),
    )
    op.create_index("ix_scalar_bookings_pool_end", "scalar_bookings", ["pool_id", "end"])
    op.create_index("ix_scalar_bookings_reservation_id", "scalar_bookings", ["reservation_id"])
    op.create_table(
        "idempotency",
        sa.Column("tenant_id", sa.String(128), nullable=False),
        sa.Column("endpoint", sa.String(64), nullable=False),
        sa.Column("key", sa.String(128), nullable=False),
        sa.Column("body_hash", sa.String(64), nullable=False),
        sa.Column("status", sa.Integer(), nullable=False),
        sa.Column("response", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "endpoint", "key"),
    )
    if op.get_bind().dialect.name == "postgresql":
        # The database itself refuses two bookings of one atom for overlapping time,
        # whatever the number of coordinators or their bugs. Not in `schema.py`:
        # SQLAlchemy metadata does not carry it and reflection does not see it.
        op.execute("CREATE EXTENSION IF NOT EXISTS btree_gist")
        op.execute(
            "ALTER TABLE bookings ADD CONSTRAINT bookings_no_overlap "
            'EXCLUDE USING gist (atom_id WITH =, int8range(start, "end") WITH &&)'
        )


def _v4_interval_reservations() -> None:
    op.create_table(
        "interval_reservations",
        sa.Column("reservation_id", sa.String(64), nullable=False),
        sa.Column("tenant_id", sa.String(128), nullable=False),
        sa.Column("pool_id", sa.String(57), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("intervals", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("reservation_id"),
    )
    op.create_index(
        "ix_interval_reservations_tenant",
        "interval_reservations",
        ["tenant_id", "created_at", "reservation_id"],
    )


def _v5_pool_versions() -> None:
    op.create_table(
        "pool_versions",
        sa.Column("pool_id", sa.String(57), nullable=False),
        sa.Column("nodes_version", sa.BigInteger(), nullable=False),
        sa.Column("bookings_version", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("pool_id"),
    )
    # Pools that exist already (a database adopted at step 4) start at version 0.
    op.execute(
        "INSERT INTO pool_versions (pool_id, nodes_version, bookings_version) "
        "SELECT pool_id, 0, 0 FROM pools"
    )


# The numbered migrations' steps 1..5, in order; index i is step i + 1.
LEGACY_STEPS: tuple[Callable[[], None], ...] = (
    _v1_initial,
    _v2_quotas,
    _v3_reservations,
    _v4_interval_reservations,
    _v5_pool_versions,
)


def upgrade() -> None:
    for step in LEGACY_STEPS:
        step()


def downgrade() -> None:
    raise NotImplementedError("the baseline is not downgraded; restore a backup instead")
