"""Ordered schema migrations, recorded in `gpufleet_schema_version`; same steps on both
SQLite and PostgreSQL.

A plain numbered list instead of Alembic: the schema is small, the coordinator migrates
itself at start (so a systemd `Type=notify` unit reports READY only once migrated), and
there is no autogeneration to trust. Each step is a function of a sync connection and
must never change once released; add a new step instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sqlalchemy import Connection, select

from coordinator.ledger import schema

_V1_TABLES = (
    schema.schema_version,
    schema.tenants,
    schema.api_keys,
    schema.pools,
    schema.pool_offers,
    schema.nodes,
    schema.atoms,
    schema.node_events,
    schema.rollup,
)


def _v1_initial(conn: Connection) -> None:
    schema.metadata.create_all(conn, tables=list(_V1_TABLES))


def _v2_quotas(conn: Connection) -> None:
    schema.quotas.create(conn)


def _v3_reservations(conn: Connection) -> None:
    for table in (
        schema.reservations,
        schema.bookings,
        schema.scalar_bookings,
        schema.idempotency,
    ):
        table.create(conn)
    if conn.dialect.name == "postgresql":
        # The database itself refuses two bookings of one atom for overlapping time,
        # whatever the number of coordinators or their bugs.
        conn.exec_driver_sql("CREATE EXTENSION IF NOT EXISTS btree_gist")
        conn.exec_driver_sql(
            "ALTER TABLE bookings ADD CONSTRAINT bookings_no_overlap "
            'EXCLUDE USING gist (atom_id WITH =, int8range(start, "end") WITH &&)'
        )


def _v4_interval_reservations(conn: Connection) -> None:
    schema.interval_reservations.create(conn)


def _v5_pool_versions(conn: Connection) -> None:
    schema.pool_versions.create(conn)
    pools = conn.execute(select(schema.pools.c.pool_id)).scalars().all()
    if pools:
        conn.execute(
            schema.pool_versions.insert(),
            [{"pool_id": p, "nodes_version": 0, "bookings_version": 0} for p in pools],
        )


MIGRATIONS: tuple[tuple[int, Callable[[Connection], None]], ...] = (
    (1, _v1_initial),
    (2, _v2_quotas),
    (3, _v3_reservations),
    (4, _v4_interval_reservations),
    (5, _v5_pool_versions),
)


def current_version(conn: Connection) -> int:
    if not conn.dialect.has_table(conn, schema.schema_version.name):
        return 0
    versions = conn.execute(select(schema.schema_version.c.version)).scalars().all()
    return max(versions, default=0)


def migrate(conn: Connection) -> list[int]:
    """Apply every step above the recorded version; returns the versions applied."""
    if conn.dialect.name == "postgresql":
        # Two coordinators starting together must not both migrate.
        conn.exec_driver_sql("SELECT pg_advisory_xact_lock(7355608)")
    applied = []
    have = current_version(conn)
    for version, step in MIGRATIONS:
        if version <= have:
            continue
        step(conn)
        conn.execute(
            schema.schema_version.insert().values(
                version=version, applied_at=int(time.time() * 1000)
            )
        )
        applied.append(version)
    return applied
