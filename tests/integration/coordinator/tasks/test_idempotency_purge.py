"""Idempotency records are kept 24 h (the SPEC's promise) and then dropped by the
`idempotency-purge` loop, on SQLite and PostgreSQL, with a fake clock."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from coordinator.app import running_coordinator
from coordinator.domain.idempotency import Recorded, body_hash
from coordinator.ledger import Database, Ledger
from coordinator.ledger import idempotency as records
from coordinator.tasks.idempotency_purge import SPEC_RETENTION_MS, IdempotencyPurge
from shared.clock import FakeClock
from tests.integration.conftest import coordinator_settings
from tests.waiting import eventually

T0 = 1_800_000_000_000
HOUR = 3_600_000
ENDPOINT = "reservations.create"


@pytest.fixture
async def db(ledger: Ledger, database_url: str) -> AsyncIterator[Database]:
    """The migrated ledger's database, written the way the booking paths write it."""
    database = Database(database_url)
    try:
        yield database
    finally:
        await database.dispose()


async def _record(db: Database, key: str, body: object, answer: object, now: int) -> object:
    """Record `answer` unless the key already has one, as a service does; the answer in force."""
    ledger = Ledger(db)
    digest = body_hash(body)
    async with ledger.transaction() as uow:
        found = await uow.idempotency.lookup("acme", ENDPOINT, key, digest)
        if found is not None:
            return found.response
        await uow.idempotency.store("acme", ENDPOINT, key, digest, Recorded(200, answer), now)
        await uow.commit()
    return answer


async def _find(db: Database, key: str, body: object) -> Recorded | None:
    async with db.read() as conn:
        return await records.lookup(conn, "acme", ENDPOINT, key, body_hash(body))


async def test_one_pass_drops_records_older_than_a_day_and_younger_ones_still_replay(
    ledger: Ledger, db: Database
) -> None:
    clock = FakeClock(T0)
    await _record(db, "old", {"n": 1}, {"reservationId": "r-old"}, clock.now_ms())
    clock.advance(HOUR)
    await _record(db, "day", {"n": 2}, {"reservationId": "r-day"}, clock.now_ms())
    clock.advance(HOUR)
    await _record(db, "young", {"n": 3}, {"reservationId": "r-young"}, clock.now_ms())
    clock.set(T0 + HOUR + SPEC_RETENTION_MS)  # "old" is a day and an hour old, "day" a day

    await IdempotencyPurge(ledger, clock).tick()

    assert await _find(db, "old", {"n": 1}) is None
    assert await _find(db, "day", {"n": 2}) == Recorded(200, {"reservationId": "r-day"})
    # A retry of the younger request replays its first answer, not the new one.
    again = await _record(db, "young", {"n": 3}, {"reservationId": "r-new"}, clock.now_ms())
    assert again == {"reservationId": "r-young"}
    # The dropped key is free again: the request is answered afresh.
    fresh = await _record(db, "old", {"n": 1}, {"reservationId": "r-again"}, clock.now_ms())
    assert fresh == {"reservationId": "r-again"}


async def test_a_longer_retention_keeps_records_past_a_day(ledger: Ledger, db: Database) -> None:
    clock = FakeClock(T0)
    await _record(db, "k", {"n": 1}, {"ok": True}, clock.now_ms())
    clock.advance(30 * HOUR)
    await IdempotencyPurge(ledger, clock, keep_ms=48 * HOUR).tick()
    assert await _find(db, "k", {"n": 1}) is not None
    clock.advance(19 * HOUR)
    await IdempotencyPurge(ledger, clock, keep_ms=48 * HOUR).tick()
    assert await _find(db, "k", {"n": 1}) is None


async def test_a_retention_below_the_spec_is_refused(ledger: Ledger) -> None:
    with pytest.raises(ValueError, match="24 h"):
        IdempotencyPurge(ledger, FakeClock(T0), keep_ms=SPEC_RETENTION_MS - 1)


async def test_the_running_coordinator_purges_on_its_own(database_url: str, nats_url: str) -> None:
    clock = FakeClock(T0)
    settings = coordinator_settings(database_url, nats_url, idempotency_purge_interval_s=0.05)
    async with running_coordinator(settings, clock):
        db = Database(database_url)
        try:
            await _record(db, "old", {"n": 1}, {"x": 1}, T0 - SPEC_RETENTION_MS - 1)
            await _record(db, "kept", {"n": 2}, {"x": 2}, T0 - SPEC_RETENTION_MS)

            async def old_is_gone() -> bool:
                return await _find(db, "old", {"n": 1}) is None

            await eventually(old_is_gone)
            assert await _find(db, "kept", {"n": 2}) is not None
        finally:
            await db.dispose()
