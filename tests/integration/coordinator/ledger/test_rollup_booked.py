"""The rollup's booked columns (SPEC §2): bookings on atoms that left the allocatable
bucket are not counted, scalar `reserved` is the peak of future commitments, and every
path that writes them — a create, a release or interval booking (the refresh path), a
node change — agrees with the rebuild, which counts booked columns as drift too."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sqlalchemy import update

from coordinator.domain.model import RollupRow
from coordinator.ledger import Ledger, schema
from coordinator.services.intervals import IntervalsBooked
from coordinator.services.reservations import Created
from tests.database import database
from tests.rig import HOUR, TENANT, Rig


@pytest.fixture
async def rig(ledger: Ledger) -> Rig:
    return await Rig.open(ledger)


async def assert_incremental_equals_rebuilt(rig: Rig, pool_id: str) -> list[RollupRow]:
    """The stored rows, which a rebuild at the same instant leaves as they are."""
    stored = (await rig.ledger.rollup([pool_id]))[pool_id]
    drift = await rig.ledger.rebuild_all(rig.clock.now_ms())
    rebuilt = (await rig.ledger.rollup([pool_id]))[pool_id]
    assert [replace(r, updated_at=0) for r in stored] == [replace(r, updated_at=0) for r in rebuilt]
    assert drift == 0
    return stored


async def test_bookings_on_a_node_in_maintenance_leave_allocated_and_available(
    rig: Rig,
) -> None:
    pool = await rig.pool(nodes=2)
    held = await rig.reservations.create(
        rig.request(pool, "eight", gpus=8, resources={"memoryGiB": 256})
    )
    assert isinstance(held, Created)
    later = await rig.reservations.create(
        rig.request(pool, "later", gpus=8, start=rig.clock.now_ms() + 2 * HOUR)
    )
    assert isinstance(later, Created)
    node = held.reservation.atoms[0].node_id
    gpu = await rig.row(pool, "gpu")
    assert (gpu.allocatable, gpu.allocated, gpu.reserved, gpu.available) == (16, 8, 8, 0)
    await rig.maintenance.set(node, True, "swap a fan", "operator/k")
    gpu, memory = await rig.row(pool, "gpu"), await rig.row(pool, "memoryGiB")
    # Only the other node is allocatable; what its GPUs hold later still counts.
    other = later.reservation.atoms[0].node_id
    expected_reserved = 0 if other == node else 8
    assert (gpu.allocatable, gpu.allocated, gpu.reserved) == (8, 0, expected_reserved)
    assert gpu.available == 8 - expected_reserved
    assert (memory.allocatable, memory.allocated, memory.available) == (512, 0, 512)
    await assert_incremental_equals_rebuilt(rig, pool)
    await rig.maintenance.set(node, False, "", "operator/k")
    gpu = await rig.row(pool, "gpu")
    assert (gpu.allocatable, gpu.allocated, gpu.reserved, gpu.available) == (16, 8, 8, 0)
    await assert_incremental_equals_rebuilt(rig, pool)


async def test_scalar_reserved_is_the_peak_of_future_commitments(rig: Rig) -> None:
    pool = await rig.pool(nodes=2)  # 1024 GiB
    booked = await rig.intervals.book(TENANT, rig.quarters(0, 16, count=96), pool, None)
    assert isinstance(booked, IntervalsBooked)
    memory = await rig.row(pool, "memoryGiB")
    assert (memory.reserved, memory.available) == (16, 1008)
    await assert_incremental_equals_rebuilt(rig, pool)


async def test_a_create_adds_scalar_commitments_as_a_peak_too(rig: Rig) -> None:
    pool = await rig.pool(nodes=2)
    now = rig.clock.now_ms()
    for i, start in enumerate((now + HOUR, now + 3 * HOUR, now + 3 * HOUR + 1800_000)):
        out = await rig.reservations.create(
            rig.request(pool, f"m{i}", start=start, resources={"memoryGiB": 64})
        )
        assert isinstance(out, Created)
    memory = await rig.row(pool, "memoryGiB")
    # [1h, 2h) and [3h, 4h) never overlap; [3h30, 4h30) overlaps the second: peak 128.
    assert (memory.allocated, memory.reserved, memory.available) == (0, 128, 896)
    await assert_incremental_equals_rebuilt(rig, pool)


async def test_the_refresh_path_subtracts_what_is_booked_later(rig: Rig) -> None:
    pool = await rig.pool(nodes=1)
    future = await rig.reservations.create(
        rig.request(pool, "future", gpus=2, start=rig.clock.now_ms() + HOUR)
    )
    assert isinstance(future, Created)
    now = await rig.reservations.create(rig.request(pool, "now", gpus=3))
    assert isinstance(now, Created)
    # A release rewrites the booked columns from the ledger (not by a delta).
    await rig.reservations.release(TENANT, now.reservation.reservation_id)
    gpu = await rig.row(pool, "gpu")
    assert (gpu.allocatable, gpu.allocated, gpu.reserved, gpu.available) == (8, 0, 2, 6)
    await assert_incremental_equals_rebuilt(rig, pool)
    # An interval booking rewrites them too, with the future GPUs still pending.
    assert isinstance(
        await rig.intervals.book(TENANT, rig.quarters(0, 32), pool, None), IntervalsBooked
    )
    gpu, memory = await rig.row(pool, "gpu"), await rig.row(pool, "memoryGiB")
    assert (gpu.reserved, gpu.available) == (2, 6)
    assert (memory.reserved, memory.available) == (32, 480)
    await assert_incremental_equals_rebuilt(rig, pool)


async def test_the_rebuild_counts_booked_columns_that_drifted(rig: Rig, database_url: str) -> None:
    pool = await rig.pool(nodes=1)
    out = await rig.reservations.create(
        rig.request(pool, "later", gpus=2, start=rig.clock.now_ms() + HOUR)
    )
    assert isinstance(out, Created)
    # The booking starting is the clock's doing, not drift.
    rig.clock.advance(HOUR + 1)
    assert await rig.ledger.rebuild_all(rig.clock.now_ms()) == 0
    gpu = await rig.row(pool, "gpu")
    assert (gpu.allocated, gpu.reserved, gpu.available) == (2, 0, 6)
    r = schema.rollup.c
    async with database(database_url) as db, db.transaction() as conn:
        await conn.execute(
            update(schema.rollup)
            .where((r.pool_id == pool) & (r.resource == "gpu"))
            .values(allocated=0, available=8)
        )
    assert await rig.ledger.rebuild_all(rig.clock.now_ms()) == 1
    gpu = await rig.row(pool, "gpu")
    assert (gpu.allocated, gpu.available) == (2, 6)
