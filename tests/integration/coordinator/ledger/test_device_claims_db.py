"""One physical device, one promise — in the database itself (SPEC §5).

Beneath the placer: claim rows written straight through the ledger's claim writer, as a
buggy or racing writer would, must be refused by PostgreSQL's constraints whenever two
of them promise the same capacity of one device for overlapping time, and accepted when
they do not. Through the booking writer: every booking writes the claim rows of the
devices it takes, on both databases, and ending a reservation ends them."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from coordinator.domain.claims import WHOLE_NODE, Claim, claim_rows, form_of, merged_rows
from coordinator.ledger import Database, Ledger
from coordinator.ledger.device_claims import insert_claims
from tests.rig import HOUR, Rig

MIG = form_of(["n0:mig:1", "n0:mig:2"])  # the GPU's current partition: two instances
SLOTS = form_of(["n0:slot:1", "n0:slot:2", "n0:slot:3"])  # another partition of it
WHOLE = form_of(["n0:gpu:G0"])


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[Database]:
    db = Database(database_url)
    await db.migrate()
    try:
        yield db
    finally:
        await db.dispose()


async def claim(
    db: Database, rid: str, claims: list[tuple[Claim, str]], start: int = 0, end: int = HOUR
) -> None:
    """Write one reservation's claims on node n0, raw, in its own transaction."""
    rows = merged_rows(row for c, form in claims for row in claim_rows(c, form))
    async with db.transaction() as conn:
        await insert_claims(conn, rid, start, end, {"n0": rows})


def part(p: str) -> Claim:
    return Claim("G0", f"n0:mig:{p}")


async def test_two_parts_of_one_partition_coexist(db: Database) -> None:
    await claim(db, "r1", [(part("1"), MIG)])
    await claim(db, "r2", [(part("2"), MIG)])


async def test_the_database_refuses_two_promises_of_one_device(db: Database) -> None:
    if db.dialect != "postgresql":
        pytest.skip("SQLite has one writer; the placer checks the same rule there")
    await claim(db, "part-1", [(part("1"), MIG)])
    # Whole vs part, part vs the same part, another partition, the whole node: refused.
    for rid, claims in (
        ("whole", [(Claim("G0"), WHOLE)]),
        ("same-part", [(part("1"), MIG)]),
        ("new-partition", [(Claim("G0", "n0:slot:1"), SLOTS)]),
        ("node", [(WHOLE_NODE, "node")]),
    ):
        with pytest.raises(IntegrityError):
            await claim(db, rid, claims, start=HOUR // 2, end=2 * HOUR)
    # The same promises after it ends, or of another device, are accepted.
    await claim(db, "whole-later", [(Claim("G0"), WHOLE)], start=HOUR, end=2 * HOUR)
    await claim(db, "other-gpu", [(Claim("G1"), form_of(["n0:gpu:G1"]))])
    # A whole GPU excludes its parts, and two wholes exclude each other.
    with pytest.raises(IntegrityError):
        await claim(db, "part-under-whole", [(part("2"), MIG)], start=HOUR, end=HOUR + 1)
    with pytest.raises(IntegrityError):
        await claim(db, "whole-again", [(Claim("G1"), form_of(["n0:gpu:G1"]))])
    # A whole-node booking holds every device of the node and shares nothing with itself.
    await claim(
        db, "node-later", [(WHOLE_NODE, "node"), (Claim("G1"), form_of(["n0:gpu:G1"]))],
        start=3 * HOUR, end=4 * HOUR,
    )  # fmt: skip
    with pytest.raises(IntegrityError):
        await claim(db, "disk", [(Claim("nvme0"), "d")], start=3 * HOUR, end=3 * HOUR + 1)


async def test_bookings_write_their_claims_and_ending_them_frees_the_device(
    ledger: Ledger, database_url: str
) -> None:
    rig = await Rig.open(ledger)
    pool = await rig.pool(nodes=1, gpus=2)
    first = await rig.reservations.create(rig.request(pool, "k1", gpus=2))
    rid = first.reservation.reservation_id  # type: ignore[union-attr]
    db = Database(database_url)
    try:
        async with db.read() as conn:
            rows = (
                await conn.execute(
                    text(
                        "SELECT device, part, exclusive FROM device_claims"
                        " WHERE reservation_id = :r ORDER BY device"
                    ),
                    {"r": rid},
                )
            ).all()
        node = f"{pool[-6:]}-n0"
        assert [(d, p, bool(x)) for d, p, x in rows] == [
            ("", "*", False),
            (f"GPU-{node}-0", "*", True),
            (f"GPU-{node}-1", "*", True),
        ]
        await rig.reservations.release("acme", rid)
        async with db.read() as conn:
            left = (
                await conn.execute(
                    text('SELECT count(*) FROM device_claims WHERE reservation_id = :r'
                         ' AND "end" > :now'),
                    {"r": rid, "now": rig.clock.now_ms()},
                )
            ).scalar_one()  # fmt: skip
        assert left == 0
        # The constraint lets the next booking of the same GPUs through.
        again = await rig.reservations.create(rig.request(pool, "k2", gpus=2))
        assert again.reservation.atoms  # type: ignore[union-attr]
    finally:
        await db.dispose()
