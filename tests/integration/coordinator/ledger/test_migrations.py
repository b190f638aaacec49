"""Migrations on SQLite and PostgreSQL: a database the numbered migrations made is adopted
with every row kept, a fresh install and an upgraded one end with the same schema, that
schema is what `schema.py` declares, and the next revision (a batch ALTER) goes through
on a filled database."""

from __future__ import annotations

import asyncio
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, MetaData, Table, inspect, select, text
from sqlalchemy.exc import IntegrityError

from coordinator.domain.gpu_use_accrual import AccrualKey, AccrualWho, Accrued
from coordinator.domain.gpu_use_conditions import OpenCondition
from coordinator.ledger import Database, Ledger, migrations
from coordinator.ledger import schema as ledger_schema
from coordinator.ledger.migrations import (
    SCRIPT_LOCATION,
    LegacySchemaError,
    MigrationError,
)
from tests import numbered_ledger
from tests.conftest import _pg_execute

# What a database at the baseline goes through to reach the head, in order.
CHAIN = [r.revision for r in reversed(list(ScriptDirectory(str(SCRIPT_LOCATION)).walk_revisions()))]
HEAD = CHAIN[-1]
ALL_TABLES = list(numbered_ledger.ROWS)
# Present at each numbered step; ROWS lists tables in the order the steps added them.
TABLES_AT = {1: ALL_TABLES[:8], 2: ALL_TABLES[:9], 3: ALL_TABLES[:13], 4: ALL_TABLES[:14]}
TABLES_AT[5] = ALL_TABLES
# Every revision after the baseline, in order; a numbered database gets them all.
LATER = ["0002"]
# Columns later revisions added to the numbered tables (null in adopted rows).
ADDED = {
    "nodes": {"pending_pool_id", "shape_hold", "accepted_shape", "duplicate_hold"},
    "reservations": {"at_risk"},
    "interval_reservations": {"at_risk"},
}


@pytest.fixture
def database_url(empty_database_url: str) -> str:
    """Here the database starts empty: these tests are about how it gets its schema."""
    return empty_database_url


def schema_signature(conn: Connection) -> dict[str, Any]:
    """What reflection sees, plus PostgreSQL's exclusion constraints and extensions,
    which it does not."""
    insp = inspect(conn)
    out: dict[str, Any] = {}
    for table in sorted(insp.get_table_names()):
        if table == "alembic_version":
            continue
        out[table] = {
            "columns": [
                (c["name"], repr(c["type"]), c["nullable"], c.get("default"))
                for c in insp.get_columns(table)
            ],
            "primary_key": insp.get_pk_constraint(table),
            "foreign_keys": sorted(
                (tuple(f["constrained_columns"]), f["referred_table"], tuple(f["referred_columns"]))
                for f in insp.get_foreign_keys(table)
            ),
            "indexes": sorted(
                (i["name"], tuple(map(str, i["column_names"])), i["unique"])
                for i in insp.get_indexes(table)
            ),
            "unique": sorted(
                (u["name"], tuple(u["column_names"])) for u in insp.get_unique_constraints(table)
            ),
        }
    if conn.dialect.name == "postgresql":
        out["<exclusion constraints>"] = [
            tuple(r)
            for r in conn.execute(
                text(
                    "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) "
                    "FROM pg_constraint WHERE contype = 'x' ORDER BY conname"
                )
            )
        ]
        out["<extensions>"] = sorted(
            conn.execute(text("SELECT extname FROM pg_extension")).scalars().all()
        )
    return out


def _revision(conn: Connection) -> str | None:
    return MigrationContext.configure(conn).get_current_revision()


async def _numbered(url: str, version: int) -> Database:
    db = Database(url)
    async with db.transaction() as conn:
        await conn.run_sync(numbered_ledger.build, version)
        await conn.run_sync(numbered_ledger.fill)
    return db


@pytest.mark.parametrize("version", [4, 5])
async def test_a_numbered_database_upgrades_to_head_with_every_row_kept(
    database_url: str, version: int
) -> None:
    db = await _numbered(database_url, version)
    try:
        async with db.read() as conn:
            before = await conn.run_sync(numbered_ledger.dump, TABLES_AT[version])
        assert await db.migrate() == CHAIN
        assert await db.migrate() == []
        async with db.read() as conn:
            after = await conn.run_sync(numbered_ledger.dump, ALL_TABLES)
            assert await conn.run_sync(_revision) == HEAD
    finally:
        await db.dispose()
    for table, added in ADDED.items():
        for row in after[table]:
            assert {c: row.pop(c) for c in added} == dict.fromkeys(added), table
    for table, rows in before.items():
        assert after[table] == rows, table
    # One more scalar booking: the interval reservation's quantity.
    expected = {t: len(r) for t, r in numbered_ledger.ROWS.items()} | {"scalar_bookings": 2}
    assert {t: len(r) for t, r in after.items()} == expected
    if version < 5:
        # Step 5 ran during adoption: existing pools got their change counters.
        assert [(r["pool_id"], r["nodes_version"]) for r in after["pool_versions"]] == [
            ("pool-1", 0),
            ("pool-2", 0),
        ]
    assert after["nodes"][0]["labels"] == {"rack": "r1", "zone": "a"}
    assert after["idempotency"][0]["response"]["reservation"]["reservationId"] == "res-1"
    assert after["reservations"][0]["atoms"] == ["n1/gpu/0", "n1/gpu/1"]
    assert [r["event_id"] for r in after["node_events"]] == [1, 2]


async def test_an_upgraded_database_keeps_working_for_the_ledger(database_url: str) -> None:
    """Keys the database generates continue after the adopted rows; the ledger reads it."""
    db = await _numbered(database_url, 5)
    ledger = await Ledger.open(database_url)
    try:
        assert await ledger.rebuild_all(2000) >= 0
        async with db.transaction() as conn:
            event_id = (
                await conn.execute(
                    ledger_schema.node_events.insert()
                    .values(node_id="n1", pool_id="pool-1", kind="node.healthy", at=2000)
                    .returning(ledger_schema.node_events.c.event_id)
                )
            ).scalar_one()
        assert event_id == 3
    finally:
        await ledger.close()
        await db.dispose()


@pytest.fixture
def other_database_url(database_url: str, tmp_path: Path) -> Iterator[str]:
    """A second fresh database on the same backend as `database_url`."""
    if database_url.startswith("sqlite"):
        yield f"sqlite:///{tmp_path / 'other.db'}"
        return
    name = f"gpufleet_t_{secrets.token_hex(6)}"
    asyncio.run(_pg_execute(f"CREATE DATABASE {name}"))
    try:
        yield f"{database_url.rsplit('/', 1)[0]}/{name}"
    finally:
        asyncio.run(_pg_execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))


async def _migrated_signature(db: Database) -> dict[str, Any]:
    try:
        await db.migrate()
        async with db.read() as conn:
            return await conn.run_sync(schema_signature)
    finally:
        await db.dispose()


@pytest.mark.parametrize("version", [1, 3, 5])
async def test_a_fresh_and_an_upgraded_database_have_the_same_schema(
    database_url: str, other_database_url: str, version: int
) -> None:
    fresh = await _migrated_signature(Database(database_url))
    upgraded = await _migrated_signature(await _numbered(other_database_url, version))
    assert upgraded == fresh
    assert "bookings" in fresh and "pool_versions" in fresh
    if database_url.startswith("postgresql"):
        assert [c[1] for c in fresh["<exclusion constraints>"]] == [
            "bookings_no_overlap",
            # r0017: exclusive and shared rows of one device part
            "device_claims_capacity",
            # r0017: one form of a device; a physical one on one node (r0008)
            "device_claims_device",
        ]
        assert "btree_gist" in fresh["<extensions>"]


async def test_the_migrated_head_is_what_the_schema_module_declares(database_url: str) -> None:
    """Autogenerate finds nothing to do. Not compared, because reflection cannot see them:
    PostgreSQL's exclusion constraints and the btree_gist extension
    (the schema test above compares them between fresh and upgraded databases)."""

    def diff(conn: Connection) -> list[Any]:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        return list(compare_metadata(context, ledger_schema.metadata))

    db = Database(database_url)
    try:
        await db.migrate()
        async with db.read() as conn:
            assert await conn.run_sync(diff) == []
    finally:
        await db.dispose()


async def test_an_unknown_numbered_version_is_refused_and_changes_nothing(
    database_url: str,
) -> None:
    db = await _numbered(database_url, 5)
    try:
        async with db.transaction() as conn:
            await conn.execute(text("INSERT INTO gpufleet_schema_version VALUES (6, 1)"))
        with pytest.raises(LegacySchemaError, match="version 6"):
            await db.migrate()
        async with db.read() as conn:
            assert "alembic_version" not in await conn.run_sync(
                lambda c: inspect(c).get_table_names()
            )
    finally:
        await db.dispose()


_NEXT_REVISION = '''
"""A column change as the next real revision would make it."""

import sqlalchemy as sa
from alembic import op

revision = "next"
down_revision = "{head}"


def upgrade() -> None:
    with op.batch_alter_table("pools") as batch:
        batch.add_column(sa.Column("note", sa.Text(), nullable=False, server_default=""))
    with op.batch_alter_table("nodes") as batch:
        batch.alter_column("hostname", type_=sa.String(512), existing_nullable=False)
'''


async def test_the_next_revision_alters_tables_that_others_refer_to_with_rows_in_place(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The change the numbered migrations could not survive: ALTER of a referenced table
    (SQLite copies it) on a filled database, through the same runner."""
    scripts = tmp_path / "migrations"
    shutil.copytree(SCRIPT_LOCATION, scripts, ignore=shutil.ignore_patterns("__pycache__"))
    (scripts / "versions" / "r9999_next.py").write_text(_NEXT_REVISION.replace("{head}", HEAD))
    db = await _numbered(database_url, 5)
    try:
        assert await db.migrate() == CHAIN
        monkeypatch.setattr(migrations, "SCRIPT_LOCATION", scripts)
        assert await db.migrate() == ["next"]
        async with db.read() as conn:
            rows = await conn.run_sync(numbered_ledger.dump, ALL_TABLES)
            if db.dialect == "sqlite":
                assert (await conn.exec_driver_sql("PRAGMA foreign_key_check")).all() == []
            nodes = {c["name"]: c for c in await conn.run_sync(_columns, "nodes")}
        assert [r["note"] for r in rows["pools"]] == ["", ""]
        assert len(rows["atoms"]) == 3 and len(rows["nodes"]) == 2
        assert getattr(nodes["hostname"]["type"], "length", None) == 512
        # Enforcement is back on for everything after the migration.
        with pytest.raises(IntegrityError):
            async with db.transaction() as conn:
                await conn.execute(text("INSERT INTO pool_offers VALUES ('nope', 'acme', 1)"))
    finally:
        await db.dispose()


async def test_a_revision_that_leaves_dangling_references_is_refused_and_changes_nothing(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scripts = tmp_path / "migrations"
    shutil.copytree(SCRIPT_LOCATION, scripts, ignore=shutil.ignore_patterns("__pycache__"))
    (scripts / "versions" / "r9999_bad.py").write_text(
        f'from alembic import op\nrevision = "bad"\ndown_revision = "{HEAD}"\n\n\n'
        "def upgrade() -> None:\n    op.execute(\"DELETE FROM tenants WHERE tenant_id = 'beta'\")\n"
    )
    db = await _numbered(database_url, 5)
    try:
        await db.migrate()
        monkeypatch.setattr(migrations, "SCRIPT_LOCATION", scripts)
        # SQLite finds the rows in its check before commit; PostgreSQL enforces at once.
        with pytest.raises(MigrationError if db.dialect == "sqlite" else IntegrityError):
            await db.migrate()
        async with db.read() as conn:
            assert await conn.run_sync(_revision) == HEAD
            tenants = await conn.run_sync(numbered_ledger.dump, ["tenants"])
        assert [t["tenant_id"] for t in tenants["tenants"]] == ["acme", "beta"]
    finally:
        await db.dispose()


def _columns(conn: Connection, table: str) -> list[Any]:
    return list(inspect(conn).get_columns(table))


async def test_coordinators_starting_together_migrate_once(database_url: str) -> None:
    """PostgreSQL: the advisory lock; SQLite: one writer at a time."""
    dbs = [Database(database_url) for _ in range(3)]
    try:
        applied = await asyncio.gather(*(db.migrate() for db in dbs))
    finally:
        for db in dbs:
            await db.dispose()
    assert sorted(applied) == [[], [], CHAIN]


# Keys the database generates that grow for the ledger's whole life (r0004).
GROWING_IDS = [
    ("node_events", "event_id"),
    ("bookings", "booking_id"),
    ("scalar_bookings", "booking_id"),
    ("device_claims", "claim_id"),
    ("alert_outbox", "seq"),
]
# Rows of the tables revisions 0002 and 0003 added, in as those revisions left them.
AT_0003 = {
    "device_claims": [
        {
            "reservation_id": "res-1", "node_id": "n1", "device": "GPU-1", "part": "",
            "exclusive": True, "form": "f" * 32, "start": 1000, "end": 5000,
        },
    ],
    "alert_outbox": [
        {"alert_id": "a1", "payload": '{"kind": "node.registered"}', "created_at": 8,
         "sent_at": 9, "attempts": 1},
        {"alert_id": "a2", "payload": '{"kind": "node.maintenance"}', "created_at": 960,
         "sent_at": None, "attempts": 0},
    ],
}  # fmt: skip


def _clear(table: str, n: int) -> dict[str, str]:
    """What keeps row `n` of a copy clear of the table's unique and exclusion constraints."""
    return {
        "bookings": {"atom_id": f"n1/gpu/{n}"},
        "device_claims": {"device": f"GPU-{n}"},
        "alert_outbox": {"alert_id": f"a{n}"},
    }.get(table, {})


def _scripts_up_to(tmp_path: Path, revision: str) -> Path:
    """The migration scripts as they stood when `revision` was the newest."""
    scripts = tmp_path / f"migrations-{revision}"
    shutil.copytree(SCRIPT_LOCATION, scripts, ignore=shutil.ignore_patterns("__pycache__"))
    for path in (scripts / "versions").glob("r*.py"):
        if path.name[1:5] > revision:
            path.unlink()
    return scripts


def _fill_0003(conn: Connection) -> None:
    metadata = MetaData()
    for name, rows in AT_0003.items():
        conn.execute(Table(name, metadata, autoload_with=conn).insert(), rows)


def _id_types(conn: Connection) -> dict[str, str]:
    insp = inspect(conn)
    out = {}
    for table, column in GROWING_IDS:
        (col,) = [c for c in insp.get_columns(table) if c["name"] == column]
        out[f"{table}.{column}"] = str(col["type"])
    return out


def _add_past_2_31(conn: Connection) -> dict[str, int]:
    """Moves each growing id past 2^31 (PostgreSQL: its sequence; SQLite: a row there),
    then adds one row the database numbers itself; returns the ids it got."""
    metadata = MetaData()
    got = {}
    for name, column in GROWING_IDS:
        table = Table(name, metadata, autoload_with=conn)
        row = dict(conn.execute(select(table).limit(1)).mappings().one())
        del row[column]
        if conn.dialect.name == "postgresql":
            conn.execute(
                text("SELECT setval(pg_get_serial_sequence(:t, :c), :n)"),
                {"t": name, "c": column, "n": 2**31 + 6},
            )
        else:
            conn.execute(table.insert().values(row | {column: 2**31 + 6} | _clear(name, 8)))
        added = conn.execute(table.insert().values(row | _clear(name, 9)))
        got[name] = added.inserted_primary_key[0]
    return got


async def test_growing_ids_become_64_bit_on_a_filled_database_at_0003(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL's SERIAL keys were 32-bit: `nodes.events` past 2^31 answered 500 and the
    next event, booking, claim or alert after 2^31 - 1 could not be written. r0004 widens
    the columns and their sequences with every row in place; SQLite's INTEGER PRIMARY KEY
    was 64-bit already and stays the rowid."""
    db = await _numbered(database_url, 5)
    try:
        monkeypatch.setattr(migrations, "SCRIPT_LOCATION", _scripts_up_to(tmp_path, "0003"))
        assert (await db.migrate())[-1] == "0003"
        async with db.transaction() as conn:
            await conn.run_sync(_fill_0003)
        tables = [*ALL_TABLES, *AT_0003]
        async with db.read() as conn:
            before = await conn.run_sync(numbered_ledger.dump, tables)
        monkeypatch.undo()
        monkeypatch.setattr(migrations, "SCRIPT_LOCATION", _scripts_up_to(tmp_path, "0004"))
        assert await db.migrate() == ["0004"]
        async with db.read() as conn:
            after = await conn.run_sync(numbered_ledger.dump, tables)
            types = await conn.run_sync(_id_types)
        assert after == before
        want = "BIGINT" if db.dialect == "postgresql" else "INTEGER"
        assert types == {f"{t}.{c}": want for t, c in GROWING_IDS}
        async with db.transaction() as conn:
            got = await conn.run_sync(_add_past_2_31)
        assert got == {t: 2**31 + 7 for t, _ in GROWING_IDS}
    finally:
        await db.dispose()


async def test_0005_adds_memory_risk_and_shapes_to_a_filled_database_at_0004(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Interval reservations' at-risk flags and expected node shapes (issue 23): every row
    kept, the new columns null (nobody at risk, no node held), and the ledger can write
    what they are for at once."""
    db = await _numbered(database_url, 5)
    try:
        monkeypatch.setattr(migrations, "SCRIPT_LOCATION", _scripts_up_to(tmp_path, "0004"))
        assert (await db.migrate())[-1] == "0004"
        async with db.read() as conn:
            before = await conn.run_sync(numbered_ledger.dump, ALL_TABLES)
        monkeypatch.undo()
        assert await db.migrate() == CHAIN[CHAIN.index("0005") :]
        async with db.read() as conn:
            after = await conn.run_sync(numbered_ledger.dump, ALL_TABLES)
        for table, added in (
            ("interval_reservations", {"at_risk"}),
            ("nodes", {"shape_hold", "accepted_shape", "duplicate_hold"}),
        ):
            for row in after[table]:
                assert {c: row.pop(c) for c in added} == dict.fromkeys(added), table
        assert after == before
        async with db.transaction() as conn:
            await conn.execute(
                ledger_schema.expected_shapes.insert().values(
                    pool_id="pool-1", profile_id="", profile_version=0, counts={"gpu": 8},
                    updated_at=1, updated_by="ops",
                )
            )  # fmt: skip
            await conn.execute(
                ledger_schema.nodes.update().values(shape_hold="held", accepted_shape={"gpu": 9})
            )
            await conn.execute(ledger_schema.interval_reservations.update().values(at_risk=None))
    finally:
        await db.dispose()


async def test_0006_adds_gpu_use_to_a_filled_database_at_0005(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Use accounting (issue 24): every row kept, `gpu_use` empty, and a bucket can be
    added to in place (the use pass's upsert) on either database."""
    db = await _numbered(database_url, 5)
    try:
        monkeypatch.setattr(migrations, "SCRIPT_LOCATION", _scripts_up_to(tmp_path, "0005"))
        assert (await db.migrate())[-1] == "0005"
        async with db.read() as conn:
            before = await conn.run_sync(numbered_ledger.dump, ALL_TABLES)
        monkeypatch.undo()
        assert await db.migrate() == CHAIN[CHAIN.index("0006") :]
        async with db.read() as conn:
            after = await conn.run_sync(numbered_ledger.dump, ALL_TABLES)
            assert (await conn.execute(ledger_schema.gpu_use.select())).all() == []
        for row in after["nodes"]:
            assert row.pop("duplicate_hold") is None  # r0008
        assert after == before
        ledger = Ledger(db)
        key = AccrualKey(0, "rsv_1", "n1", "GPU-1", "gpu", "acme")
        for _ in range(2):
            await ledger.gpu_use.record({key: Accrued(AccrualWho("p1", None), 1000, 500)}, [], [])
        (bucket,) = await ledger.gpu_use.buckets(0, 3_600_000)
        assert (bucket.reservation_id, bucket.used_ms, bucket.weighted_ms) == ("rsv_1", 2000, 1000)
    finally:
        await db.dispose()


async def test_0015_keys_use_by_tenant_too_on_a_filled_database_at_0013(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unbooked use per tenant (issue 35): the buckets written before are kept as they
    are, the key is the schema module's (tenant included), and two tenants' unbooked use
    of one GPU in one hour then lands in two buckets, each added to in place."""
    db = await _numbered(database_url, 5)
    try:
        monkeypatch.setattr(migrations, "SCRIPT_LOCATION", _scripts_up_to(tmp_path, "0013"))
        assert (await db.migrate())[-1] == "0013"
        row = {
            "hour": 0, "reservation_id": "", "node_id": "n1", "unit": "GPU-1",
            "resource": "gpu", "tenant_id": "acme", "pool_id": "p1", "project_id": None,
            "used_ms": 1000, "weighted_ms": 500, "unknown_ms": 0, "idle_ms": 100,
        }  # fmt: skip
        async with db.transaction() as conn:
            await conn.execute(
                ledger_schema.gpu_use.insert(), [row, row | {"reservation_id": "rsv_1"}]
            )
        async with db.read() as conn:
            before = await conn.run_sync(numbered_ledger.dump, ["gpu_use"])
        monkeypatch.undo()
        later = await db.migrate()
        assert "0015" in later and later == CHAIN[CHAIN.index("0013") + 1 :]
        async with db.read() as conn:
            assert await conn.run_sync(numbered_ledger.dump, ["gpu_use"]) == before
            key = await conn.run_sync(lambda c: inspect(c).get_pk_constraint("gpu_use"))
        assert (
            key["constrained_columns"]
            == [c.name for c in ledger_schema.gpu_use.primary_key.columns]
            == ["hour", "reservation_id", "node_id", "unit", "resource", "tenant_id"]
        )
        ledger = Ledger(db)
        for tenant in ("acme", "beta", "beta"):
            key_of = AccrualKey(0, "", "n1", "GPU-1", "gpu", tenant)
            await ledger.gpu_use.record({key_of: Accrued(AccrualWho("p1", None), 10, 5)}, [], [])
        got = await ledger.gpu_use.buckets(0, 3_600_000)
        assert sorted((b.reservation_id, b.tenant_id, b.used_ms) for b in got) == [
            ("", "acme", 1010), ("", "beta", 20), ("rsv_1", "acme", 1000),
        ]  # fmt: skip
    finally:
        await db.dispose()


async def test_0008_records_who_holds_each_physical_device_of_a_filled_database(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Physical identity (issue 31): every row kept, no node held, and each current GPU
    of a node held by it, so that a second node id showing it is held at once."""
    db = await _numbered(database_url, 5)
    try:
        monkeypatch.setattr(migrations, "SCRIPT_LOCATION", _scripts_up_to(tmp_path, "0007"))
        assert (await db.migrate())[-1] == "0007"
        async with db.read() as conn:
            before = await conn.run_sync(numbered_ledger.dump, ALL_TABLES)
        monkeypatch.undo()
        assert await db.migrate() == CHAIN[CHAIN.index("0008") :]
        async with db.read() as conn:
            after = await conn.run_sync(numbered_ledger.dump, ALL_TABLES)
            held = (
                await conn.execute(
                    select(
                        ledger_schema.device_identities.c.identity,
                        ledger_schema.device_identities.c.node_id,
                    ).order_by(ledger_schema.device_identities.c.identity)
                )
            ).all()
        for row in after["nodes"]:
            assert row.pop("duplicate_hold") is None
        assert after == before
        # The retired GPU-2 is nobody's.
        assert [tuple(r) for r in held] == [("gpu:GPU-0", "n1"), ("gpu:GPU-1", "n1")]
    finally:
        await db.dispose()


async def test_0011_adds_use_conditions_to_a_filled_database_at_0007(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Use conditions (issue 34): every row kept, `use_conditions` empty, and a condition
    opened, read back and closed on either database."""
    db = await _numbered(database_url, 5)
    try:
        monkeypatch.setattr(migrations, "SCRIPT_LOCATION", _scripts_up_to(tmp_path, "0007"))
        assert (await db.migrate())[-1] == "0007"
        async with db.read() as conn:
            before = await conn.run_sync(numbered_ledger.dump, ALL_TABLES)
        monkeypatch.undo()
        assert await db.migrate() == CHAIN[CHAIN.index("0007") + 1 :]  # 0011 among them
        assert "0011" in CHAIN
        async with db.read() as conn:
            after = await conn.run_sync(numbered_ledger.dump, ALL_TABLES)
        for row in after["nodes"]:
            assert row.pop("duplicate_hold") is None  # r0008, on the way
        assert after == before
        ledger = Ledger(db)
        assert await ledger.gpu_use.conditions() == []
        opened = OpenCondition(
            "gpu.foreignUse|n1|GPU-1|pod|" + "u" * 256, "gpu.foreignUse", "p1", "n1", "GPU-1",
            "pod", "u" * 256, since=5,
        )  # fmt: skip
        await ledger.gpu_use.record({}, [], [], [opened], [])
        assert await ledger.gpu_use.conditions() == [opened]
        await ledger.gpu_use.record({}, [], [], [], [opened.key])
        assert await ledger.gpu_use.conditions() == []
    finally:
        await db.dispose()
