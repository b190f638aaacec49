"""One quota arithmetic for both APIs and every pool (SPEC §5, truth under change):
a tenant-wide quota counts every pool, interval reservations and compute `memoryGiB`
bookings draw on the same limit, what counts is the peak at one instant of the window,
and concurrent writers in different pools cannot overrun it together."""

from __future__ import annotations

import asyncio

import pytest

from coordinator.domain.errors import QuotaExceeded
from coordinator.domain.model import Quota
from coordinator.ledger import Ledger
from coordinator.services.intervals import IntervalsBooked, IntervalsRefused
from coordinator.services.reservations import Created, Refused
from tests.rig import HOUR, TENANT, Rig, rollup_rows_held, waiting_on_locks


@pytest.fixture
async def rig(ledger: Ledger) -> Rig:
    return await Rig.open(ledger)


async def test_interval_reservations_in_two_pools_share_a_tenant_wide_limit(rig: Rig) -> None:
    a, b = await rig.pool(), await rig.pool()
    await rig.ledger.quotas.set(Quota(TENANT, None, "memoryGiB", 64), rig.clock.now_ms())
    first = await rig.intervals.book(TENANT, rig.quarters(0, 64) | {"poolId": a}, None, None)
    assert isinstance(first, IntervalsBooked)
    second = await rig.intervals.book(TENANT, rig.quarters(0, 64) | {"poolId": b}, None, None)
    assert isinstance(second, IntervalsRefused)
    (short,) = second.shortfalls
    assert (short.reservable_gb, short.reason) == (0, "insufficient_capacity")


async def test_compute_memory_and_interval_reservations_draw_on_one_limit(rig: Rig) -> None:
    pool = await rig.pool()
    await rig.ledger.quotas.set(Quota(TENANT, None, "memoryGiB", 64), rig.clock.now_ms())
    start = rig.clock.now_ms() + HOUR
    held = await rig.reservations.create(
        rig.request(pool, "c1", start=start, resources={"memoryGiB": 64})
    )
    assert isinstance(held, Created)
    # The same hour through the interval API: the compute booking already used the limit.
    out = await rig.intervals.book(TENANT, rig.quarters(0, 64), pool, None)
    assert isinstance(out, IntervalsRefused)
    assert out.shortfalls[0].reservable_gb == 0
    # And the other way round, in a later hour: the interval booking binds compute.
    later = await rig.intervals.book(TENANT, rig.quarters(8, 64), pool, None)
    assert isinstance(later, IntervalsBooked)
    refused = await rig.reservations.create(
        rig.request(pool, "c2", start=start + 2 * HOUR, resources={"memoryGiB": 8})
    )
    assert isinstance(refused, Refused) and isinstance(refused.error, QuotaExceeded)
    assert (refused.error.details["used"], refused.error.details["limit"]) == (64, 64)


async def test_a_quota_counts_the_peak_at_one_instant_not_every_overlapping_booking(
    rig: Rig,
) -> None:
    pool = await rig.pool()
    await rig.ledger.quotas.set(Quota(TENANT, None, "memoryGiB", 64), rig.clock.now_ms())
    # 48 GB in each of four consecutive quarters: never more than 48 at once.
    assert isinstance(
        await rig.intervals.book(TENANT, rig.quarters(0, 48, count=4), pool, None),
        IntervalsBooked,
    )
    start = rig.clock.now_ms() - rig.clock.now_ms() % 900_000 + HOUR
    fits = await rig.reservations.create(
        rig.request(pool, "m16", start=start, resources={"memoryGiB": 16})
    )
    assert isinstance(fits, Created), fits
    over = await rig.reservations.create(
        rig.request(pool, "m4", start=start, resources={"memoryGiB": 4})
    )
    assert isinstance(over, Refused) and isinstance(over.error, QuotaExceeded)
    assert over.error.details["used"] == 64


async def test_concurrent_creates_in_two_pools_cannot_both_pass_a_tenant_wide_quota(
    rig: Rig, database_url: str
) -> None:
    if rig.ledger.dialect != "postgresql":
        pytest.skip("SQLite admits one writer at a time")
    a, b = await rig.pool(), await rig.pool()
    await rig.ledger.quotas.set(Quota(TENANT, None, "gpu", 1), rig.clock.now_ms())
    async with rollup_rows_held(database_url, a, b):
        # Both get as far as their rollup rows (or the tenant's quota lock) and wait there.
        racing = [
            asyncio.create_task(rig.reservations.create(rig.request(a, "in-a"))),
            asyncio.create_task(rig.reservations.create(rig.request(b, "in-b"))),
        ]
        await waiting_on_locks(database_url, 2)
    outs = await asyncio.gather(*racing)
    assert sorted(type(o).__name__ for o in outs) == ["Created", "Refused"], outs
    refused = next(o for o in outs if isinstance(o, Refused))
    assert isinstance(refused.error, QuotaExceeded)


async def test_concurrent_interval_reservations_in_two_pools_share_the_limit(
    rig: Rig, database_url: str
) -> None:
    if rig.ledger.dialect != "postgresql":
        pytest.skip("SQLite admits one writer at a time")
    a, b = await rig.pool(), await rig.pool()
    await rig.ledger.quotas.set(Quota(TENANT, None, "memoryGiB", 64), rig.clock.now_ms())
    async with rollup_rows_held(database_url, a, b):
        racing = [
            asyncio.create_task(rig.intervals.book(TENANT, rig.quarters(0, 64), p, None))
            for p in (a, b)
        ]
        await waiting_on_locks(database_url, 2)
    outs = await asyncio.gather(*racing)
    assert sorted(type(o).__name__ for o in outs) == ["IntervalsBooked", "IntervalsRefused"]
