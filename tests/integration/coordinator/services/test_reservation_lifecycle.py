"""Renew, release, expiry and preemption of one reservation are serialized with each
other and with the reservation clock (SPEC §5, truth under change): a renew that
answers "extended" holds."""

from __future__ import annotations

import asyncio

import pytest

from coordinator.domain.errors import InvalidInput
from coordinator.domain.reservation import LIVE
from coordinator.ledger import Ledger
from coordinator.services.reservations import Created, Current
from tests.rig import TENANT, Rig, rollup_rows_held, waiting_on_locks


@pytest.fixture
async def rig(ledger: Ledger) -> Rig:
    return await Rig.open(ledger)


async def test_a_renew_racing_the_clock_never_answers_extended_for_an_expired_lease(
    rig: Rig, database_url: str
) -> None:
    if rig.ledger.dialect != "postgresql":
        pytest.skip("SQLite admits one writer at a time")
    pool = await rig.pool(gpus=1)
    leased = await rig.reservations.create(rig.request(pool, "lease", leaseSeconds=60))
    assert isinstance(leased, Created)
    rid = leased.reservation.reservation_id
    t0 = rig.clock.now_ms()
    rig.clock.advance(59_000)  # the renew still sees a live lease …
    async with rollup_rows_held(database_url, pool):
        # … while the clock, a moment later, expires it and waits before committing.
        expiring = asyncio.create_task(rig.ledger.reservations.expire_and_preempt(t0 + 61_000))
        await waiting_on_locks(database_url, 1)
        renewing = asyncio.create_task(rig.reservations.renew(TENANT, rid, 120))
        await waiting_on_locks(database_url, 2)
    ended = await expiring
    assert [r.reservation_id for r in ended] == [rid]
    answer: Current | None
    try:
        answer = await renewing
    except InvalidInput:
        answer = None
    stored = await rig.ledger.reservations.get(rid, TENANT)
    if answer is not None:
        # "extended" must hold: the stored row is live with the lease it was answered.
        assert stored.stored_state == LIVE, (answer.reservation.state(answer.at), stored)
        assert stored.lease_expires_at == answer.reservation.lease_expires_at
    else:
        assert stored.stored_state == "expired"
    # Either way the GPU is promised once: to the renewed lease, or to a new create.
    rig.clock.advance(2_000)
    again = await rig.reservations.create(rig.request(pool, "after"))
    assert isinstance(again, Created) == (answer is None)


async def test_release_after_the_clock_ended_a_reservation_changes_nothing(rig: Rig) -> None:
    pool = await rig.pool(gpus=1)
    leased = await rig.reservations.create(rig.request(pool, "lease", leaseSeconds=60))
    assert isinstance(leased, Created)
    rid = leased.reservation.reservation_id
    rig.clock.advance(61_000)
    await rig.ledger.reservations.expire_and_preempt(rig.clock.now_ms())
    out = await rig.reservations.release(TENANT, rid)
    assert out.reservation.stored_state == "expired"
    with pytest.raises(InvalidInput):
        await rig.reservations.renew(TENANT, rid, None)
