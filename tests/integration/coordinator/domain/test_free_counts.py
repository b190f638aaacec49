"""The pool snapshot's kept free counts over a real ledger: after a random sequence of
bookings (each learned by the cache from its commit, one node recounted) and releases
(a reload), the placer given the kept counts answers exactly what it answers counting
every node itself, for windows that overlap every booking and for ones that do not."""

from __future__ import annotations

import random
from dataclasses import replace

from coordinator.domain.booking import Booked, BookingRequest
from coordinator.domain.placement_model import DeviceRequest, PlacementRequest
from coordinator.domain.placer import place
from coordinator.ledger import Ledger
from coordinator.services.node_records import record_inventory
from shared.ids import new_pool_id
from tests.factories import make_inventory

NOW = 1_700_000_000_000
HOUR = 3_600_000


def booking(pool: str, count: int, mig: bool, start: int, hours: int, spot: bool) -> BookingRequest:
    cls = "gpu.mig" if mig else "gpu"
    return BookingRequest(
        tenant_id="acme", pool_id=pool, project_id=None,
        placement=PlacementRequest(devices=(DeviceRequest(cls, count),), spot=spot),
        start=start, duration_ms=hours * HOUR, lease_seconds=None, resources={}, gang=None,
        notice_ms=120_000,
    )  # fmt: skip


async def _same_answer(ledger: Ledger, pool: str, rng: random.Random) -> int:
    """Previews for a few windows and requests, kept counts against a full count; how
    many of them fit."""
    fits = 0
    for _ in range(4):
        start = NOW + rng.randrange(0, 6) * HOUR
        end = start + rng.randrange(1, 4) * HOUR
        cls = rng.choice(["gpu", "gpu", "gpu.mig"])
        req = PlacementRequest(devices=(DeviceRequest(cls, rng.randrange(1, 5)),))
        async with ledger.database.read() as conn:
            snap = await ledger.snapshots.snapshot(conn, pool, start, end, NOW)
        assert snap.order is not None
        for ignore_spot in (False, True):
            kept = place(req, snap, ignore_spot=ignore_spot)
            counted = place(req, replace(snap, order=None), ignore_spot=ignore_spot)
            assert kept == counted, (req, start, end, ignore_spot)
            fits += kept.fits
    return fits


async def test_kept_free_counts_place_exactly_like_a_full_count(ledger: Ledger) -> None:
    await ledger.tenants.create("acme", "Acme", NOW)
    pool = new_pool_id()
    await ledger.pools.create(pool, "p", "acme", None, NOW)
    for i in range(6):
        inv = make_inventory(f"n{i}", pool, gpus=4, mig=2 if i % 3 == 0 else 0)
        await record_inventory(ledger, inv, NOW)
    rng = random.Random(15)
    live: list[str] = []
    fits = booked = released = 0
    for _ in range(40):
        if live and rng.random() < 0.25:
            rid = live.pop(rng.randrange(len(live)))
            async with ledger.transaction() as uow:
                await uow.reservations.release(rid, "acme", NOW)
                await uow.commit()
            released += 1
        else:
            r = booking(
                pool, rng.randrange(1, 4), rng.random() < 0.2, NOW + rng.randrange(0, 5) * HOUR,
                rng.randrange(1, 4), rng.random() < 0.3,
            )  # fmt: skip
            async with ledger.transaction() as uow:
                out = await uow.bookings.book(r, NOW)
                await uow.commit()
            if isinstance(out, Booked):
                live.append(out.reservation.reservation_id)
                booked += 1
        fits += await _same_answer(ledger, pool, rng)
    # The sequence did what it is meant to: bookings, releases, answers either way.
    assert booked > 10 and released > 3
    assert 0 < fits < 40 * 8
