"""Schema migrations: Alembic revisions in `versions/`, run by the coordinator itself at
start (so a systemd `Type=notify` unit reports READY only once migrated).

Each revision is explicit DDL, never `schema.py`'s current tables, so a fresh install
replays history exactly as an upgraded database lived it. A released revision never
changes; a schema change is a new revision (`op.batch_alter_table` for anything SQLite
cannot ALTER in place) plus the matching edit to `schema.py`, and the tests compare the
two. Revision `0001` is the schema the numbered migrations (v1..v5, recorded in
`gpufleet_schema_version`) built; a database they made is brought to v5 with the same
DDL and stamped `0001` before the upgrade, without touching its rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.migration import MigrationContext, MigrationInfo
from alembic.operations import Operations
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, inspect, select, text

from coordinator.domain.errors import CoordinatorError

__all__ = ["BASELINE", "SCRIPT_LOCATION", "LegacySchemaError", "MigrationError", "migrate"]

SCRIPT_LOCATION = Path(__file__).parent
BASELINE = "0001"
_LEGACY_TABLE = "gpufleet_schema_version"
_LEGACY_HEAD = 5
_VERSION_TABLE = "alembic_version"
# Two coordinators starting together must not both migrate.
_ADVISORY_LOCK = 7355608


class MigrationError(CoordinatorError):
    """The database cannot be brought to the newest revision; nothing was changed."""


class LegacySchemaError(MigrationError):
    """A `gpufleet_schema_version` this code does not know how to adopt."""


def _config(conn: Connection, applied: list[str], script_location: Path) -> Config:
    def on_version_apply(*, step: MigrationInfo, **_: Any) -> None:
        applied.extend(step.up_revision_ids)

    config = Config()
    config.set_main_option("script_location", str(script_location))
    config.attributes["connection"] = conn
    config.attributes["on_version_apply"] = on_version_apply
    return config


def _legacy_version(conn: Connection) -> int | None:
    """The numbered migrations' version of a database Alembic has not seen, else None."""
    tables = set(inspect(conn).get_table_names())
    if _VERSION_TABLE in tables or _LEGACY_TABLE not in tables:
        return None
    versions = conn.execute(select(text("version")).select_from(text(_LEGACY_TABLE)))
    version = max(versions.scalars().all(), default=0)
    if not 1 <= version <= _LEGACY_HEAD:
        raise LegacySchemaError(
            f"{_LEGACY_TABLE} records version {version}; this coordinator adopts 1..{_LEGACY_HEAD}",
            {"version": version},
        )
    return int(version)


def _adopt(conn: Connection, config: Config, version: int) -> None:
    """Run the baseline's remaining steps on a numbered-migrations database, then stamp it."""
    baseline = ScriptDirectory.from_config(config).get_revision(BASELINE)
    assert baseline is not None
    with Operations.context(MigrationContext.configure(conn)):
        for step in baseline.module.LEGACY_STEPS[version:]:
            step()
    command.stamp(config, BASELINE)


def migrate(conn: Connection) -> list[str]:
    """Bring the database to the newest revision inside the caller's transaction; returns
    the revisions applied (or stamped, for a database adopted from the numbered steps).

    On SQLite the caller turns foreign-key enforcement off first (it can only change
    outside a transaction): a batch ALTER copies a table, drops the original and renames
    the copy, and the drop would otherwise count every referring row as a violation.
    The references are checked here instead, before the caller commits."""
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_ADVISORY_LOCK})")
    applied: list[str] = []
    config = _config(conn, applied, SCRIPT_LOCATION)
    legacy = _legacy_version(conn)
    if legacy is not None:
        _adopt(conn, config, legacy)
    command.upgrade(config, "head")
    if conn.dialect.name == "sqlite":
        broken = conn.exec_driver_sql("PRAGMA foreign_key_check").all()
        if broken:
            raise MigrationError(
                f"migration left {len(broken)} rows with dangling references",
                {"rows": [tuple(r) for r in broken[:10]]},
            )
    return applied
