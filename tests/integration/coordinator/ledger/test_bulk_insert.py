"""`bulk.insert_many` writes exactly what SQLAlchemy's executemany writes (on both
databases): the same stored values, JSON's null for a None JSON value included, and a
clash leaves as SQLAlchemy's IntegrityError (the unit of work's `WriteRaced`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import String, Table, cast, select, text
from sqlalchemy.exc import IntegrityError

from coordinator.ledger import Database, schema
from coordinator.ledger.bulk import insert_many


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[Database]:
    db = Database(database_url)
    await db.migrate()
    try:
        yield db
    finally:
        await db.dispose()


def reservation(rid: str, **changed: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "reservation_id": rid, "tenant_id": "acme", "pool_id": "pool-1", "project_id": None,
        "state": "live", "spot": False, "binding": "hold", "start": 10, "end": 20,
        "lease_seconds": None, "lease_expires_at": None, "preempt_at": None,
        "resources": {}, "gang": None,
        "atoms": [{"atomId": "n0:gpu:0", "nodeId": "n0", "class": "gpu"}],
        "created_at": 5, "updated_at": 5, "at_risk": None,
    }  # fmt: skip
    return row | changed


async def stored(db: Database, table: Table, key: str, ids: list[str]) -> list[tuple[Any, ...]]:
    """The rows as the database holds them, every column as text (JSON as written)."""
    columns = [c for c in table.columns if c.name not in ("booking_id", "claim_id")]
    query = (
        select(*(cast(c, String) for c in columns))
        .where(table.c[key].in_(ids))
        .order_by(table.c[key])
    )
    async with db.read() as conn:
        return [tuple(r) for r in (await conn.execute(query)).all()]


async def test_rows_are_stored_as_sqlalchemy_stores_them(db: Database) -> None:
    ours = [
        reservation("r-a1"),
        reservation("r-a2", gang={"size": 2, "key": "rack"}, spot=True, project_id="prj",
                    at_risk={"reason": "unhealthy", "since": 7, "atoms": ["n0:gpu:0"]},
                    resources={"vcpu": 4}, lease_seconds=60, lease_expires_at=65_000),
    ]  # fmt: skip
    theirs = [row | {"reservation_id": row["reservation_id"].replace("-a", "-b")} for row in ours]
    # Keys in another order than the table's columns (as `BookingRows` builds them).
    bookings = [
        {"reservation_id": rid, "spot": i == 1, "start": 10, "end": 20, "tenant_id": "acme",
         "pool_id": "pool-1", "node_id": "n0", "atom_id": f"n0:gpu:{i}", "class": "gpu"}
        for i, rid in enumerate(["r-a1", "r-a2"])
    ]  # fmt: skip
    other = [b | {"reservation_id": b["reservation_id"].replace("-a", "-b"), "start": 30,
                  "end": 40} for b in bookings]  # fmt: skip
    async with db.transaction() as conn:
        await insert_many(conn, schema.reservations, ours)
        await insert_many(conn, schema.bookings, bookings)
        await conn.execute(schema.reservations.insert(), theirs)
        await conn.execute(schema.bookings.insert(), other)
    mine = await stored(db, schema.reservations, "reservation_id", ["r-a1", "r-a2"])
    sqla = await stored(db, schema.reservations, "reservation_id", ["r-b1", "r-b2"])
    assert len(mine) == 2
    assert [r[1:] for r in mine] == [r[1:] for r in sqla]
    mine = await stored(db, schema.bookings, "reservation_id", ["r-a1", "r-a2"])
    sqla = await stored(db, schema.bookings, "reservation_id", ["r-b1", "r-b2"])
    assert [r[1:7] for r in mine] == [r[1:7] for r in sqla]
    # A None JSON value is JSON's null, as SQLAlchemy writes it, not SQL NULL.
    async with db.read() as conn:
        nulls = await conn.execute(
            text("SELECT COUNT(*) FROM reservations WHERE gang IS NULL OR at_risk IS NULL")
        )
        assert nulls.scalar_one() == 0


async def test_a_clash_is_sqlalchemys_integrity_error_and_writes_nothing(db: Database) -> None:
    async with db.transaction() as conn:
        await insert_many(conn, schema.reservations, [reservation("r-1")])
    with pytest.raises(IntegrityError):
        async with db.transaction() as conn:
            await insert_many(conn, schema.reservations, [reservation("r-2"), reservation("r-1")])
    async with db.read() as conn:
        count = await conn.execute(text("SELECT COUNT(*) FROM reservations"))
        assert count.scalar_one() == 1
