"""The write workflows below HTTP: reservations (create with its wait, replay and
refusals, renew, release), interval bookings and node maintenance, run on a real ledger
(SQLite and PostgreSQL) with a fake clock and a recording alert sink — no NATS, no
socket."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from coordinator.api.http.render import INTERVAL_ANSWERS, RESERVATION_ANSWERS, reservation
from coordinator.api.shapes.base import dump
from coordinator.api.shapes.reservation_input import ReservationCreateInput
from coordinator.domain.errors import (
    CapacityNotAvailable,
    IdempotencyKeyConflict,
    InvalidInput,
    NotFound,
    QuotaExceeded,
)
from coordinator.domain.intervals import IntervalError, format_time
from coordinator.domain.model import Quota
from coordinator.ledger import Ledger, ReservationFilter
from coordinator.services.capacity_signal import CapacitySignal
from coordinator.services.idempotent import Replayed
from coordinator.services.intervals import IntervalBookings, IntervalsBooked, IntervalsRefused
from coordinator.services.maintenance import Maintenance
from coordinator.services.node_records import record_inventory
from coordinator.services.reservations import (
    Created,
    CreateRequest,
    Refused,
    Reservations,
)
from shared.clock import FakeClock
from shared.ids import new_pool_id
from tests.factories import make_inventory
from tests.fakes import RecordingAlerts

HOUR = 3_600_000
Q = 900_000


class World:
    def __init__(self, ledger: Ledger, pool_id: str) -> None:
        self.ledger, self.pool_id = ledger, pool_id
        self.clock = FakeClock()
        self.alerts = RecordingAlerts()
        self.capacity = CapacitySignal()
        self.reservations = Reservations(
            ledger, self.clock, self.alerts, self.capacity, RESERVATION_ANSWERS, notice_ms=60_000
        )
        self.intervals = IntervalBookings(ledger, self.clock, self.capacity, INTERVAL_ANSWERS)
        self.maintenance = Maintenance(ledger, self.clock, self.alerts, self.capacity)

    def request(self, gpus: int, key: str, wait_ms: int = 0, **extra: Any) -> CreateRequest:
        body = ReservationCreateInput.model_validate(
            {
                "tenantId": "acme",
                "poolId": self.pool_id,
                "devices": [{"class": "gpu", "count": gpus}],
                "duration": "1h",
                "idempotencyKey": key,
            }
            | extra
        )
        return CreateRequest(
            tenant_id=body.tenant_id,
            pool_id=body.pool_id,
            project_id=None,
            placement=body.placement(),
            start=body.start,
            duration_ms=body.duration_ms,
            lease_seconds=body.lease_seconds,
            resources={},
            gang=None,
            idempotency_key=body.idempotency_key,
            canonical=body.canonical(),
            wait_ms=wait_ms,
        )


@pytest.fixture
async def world(ledger: Ledger) -> World:
    pool_id = new_pool_id()
    clock = FakeClock()
    await ledger.tenants.create("acme", "Acme", clock.now_ms())
    await ledger.pools.create(pool_id, "p", "acme", None, clock.now_ms())
    await record_inventory(ledger, make_inventory("n1", pool_id, gpus=4), clock.now_ms())
    return World(ledger, pool_id)


async def test_create_books_once_and_replays_the_first_answer(world: World) -> None:
    out = await world.reservations.create(world.request(2, "k1"))
    assert isinstance(out, Created) and len(out.reservation.atoms) == 2
    world.clock.advance(HOUR)
    again = await world.reservations.create(world.request(2, "k1"))
    # A replay is the first answer, as it was worded then (state "active" at booking).
    assert again == Replayed(200, dump(reservation(out.reservation, out.at)))
    assert (
        len(await world.ledger.listing.page(ReservationFilter(tenant_id="acme"), None, 10, 0)) == 1
    )
    with pytest.raises(IdempotencyKeyConflict):
        await world.reservations.create(world.request(3, "k1"))


async def test_a_refusal_is_recorded_and_replayed_after_capacity_frees(world: World) -> None:
    held = await world.reservations.create(world.request(4, "all"))
    assert isinstance(held, Created)
    refused = await world.reservations.create(world.request(1, "late"))
    assert isinstance(refused, Refused) and isinstance(refused.error, CapacityNotAvailable)
    assert refused.error.details["devices"][0]["available"] == 0
    await world.reservations.release("acme", held.reservation.reservation_id)
    replay = await world.reservations.create(world.request(1, "late"))
    assert isinstance(replay, Replayed) and replay.status == 409
    assert replay.body["error"]["code"] == "CAPACITY_NOT_AVAILABLE"
    # A new key is a new request, and now it fits.
    assert isinstance(await world.reservations.create(world.request(1, "later")), Created)


async def test_quota_exceeded_is_a_recorded_refusal(world: World) -> None:
    await world.ledger.quotas.set(Quota("acme", None, "gpu", 2), world.clock.now_ms())
    out = await world.reservations.create(world.request(3, "q"))
    assert isinstance(out, Refused) and isinstance(out.error, QuotaExceeded)
    await world.ledger.quotas.set(Quota("acme", None, "gpu", 8), world.clock.now_ms())
    replay = await world.reservations.create(world.request(3, "q"))
    assert isinstance(replay, Replayed)
    assert (replay.status, replay.body["error"]["code"]) == (409, "QUOTA_EXCEEDED")


async def test_a_waiting_request_books_when_a_release_frees_capacity(world: World) -> None:
    held = await world.reservations.create(world.request(4, "all"))
    assert isinstance(held, Created)
    waiting = asyncio.create_task(world.reservations.create(world.request(2, "w", 5_000)))
    await asyncio.sleep(0.2)
    assert not waiting.done()
    await world.reservations.release("acme", held.reservation.reservation_id)
    out = await asyncio.wait_for(waiting, 5)
    assert isinstance(out, Created)


async def test_preempted_spot_holders_are_noticed_on_the_alert_sink(world: World) -> None:
    spot = await world.reservations.create(world.request(4, "spot", spot=True))
    assert isinstance(spot, Created) and not world.alerts.alerts
    out = await world.reservations.create(world.request(2, "regular"))
    assert isinstance(out, Created)
    assert [v.reservation_id for v in out.victims] == [spot.reservation.reservation_id]
    (alert,) = world.alerts.alerts
    assert alert.kind == "reservation.notice"
    assert alert.reservation_id == spot.reservation.reservation_id
    assert alert.details["preemptAt"] == world.clock.now_ms() + 60_000


async def test_renew_and_release_take_now_from_the_clock(world: World) -> None:
    leased = await world.reservations.create(world.request(1, "l", leaseSeconds=60))
    assert isinstance(leased, Created)
    rid = leased.reservation.reservation_id
    world.clock.advance(30_000)
    renewed = await world.reservations.renew("acme", rid, 120)
    assert renewed.reservation.lease_expires_at == world.clock.now_ms() + 120_000
    released = await world.reservations.release("acme", rid)
    assert released.reservation.state(released.at) == "released"
    assert released.reservation.ended_at == world.clock.now_ms()
    with pytest.raises(InvalidInput):
        await world.reservations.renew("acme", rid, None)
    with pytest.raises(NotFound):
        await world.reservations.release("other", rid)


def _interval_body(k: int, gb: int, t0: int) -> dict[str, Any]:
    start = t0 - t0 % Q + HOUR + k * Q
    return {
        "intervals": [
            {"startsAt": format_time(start), "endsAt": format_time(start + Q), "capacityGb": gb}
        ]
    }


async def test_interval_bookings_all_or_nothing_with_recorded_refusals(world: World) -> None:
    now = world.clock.now_ms()
    memory_gib = (await world.ledger.rollup([world.pool_id]))[world.pool_id]
    total = next(r.allocatable for r in memory_gib if r.resource == "memoryGiB")
    ok = await world.intervals.book("acme", _interval_body(0, 16, now), None, "a")
    assert isinstance(ok, IntervalsBooked) and ok.reservation.pool_id == world.pool_id
    too_big = total - total % 4 + 4
    refused = await world.intervals.book("acme", _interval_body(0, too_big, now), None, "b")
    assert isinstance(refused, IntervalsRefused)
    (short,) = refused.shortfalls
    assert (short.requested_gb, short.reason) == (too_big, "insufficient_capacity")
    replay = await world.intervals.book("acme", _interval_body(0, too_big, now), None, "b")
    assert isinstance(replay, Replayed) and replay.status == 409
    assert replay.body["error"] == "capacity_not_available"
    with pytest.raises(IntervalError, match="30 minutes"):
        await world.intervals.book("acme", _interval_body(-4, 16, now), None, None)
    with pytest.raises(NotFound):
        await world.intervals.book("acme", _interval_body(1, 16, now), new_pool_id(), None)


async def test_maintenance_changes_once_and_alerts_once(world: World) -> None:
    out = await world.maintenance.set("n1", True, "disk swap", "operator/k1")
    assert (out.changed, out.pool_id) == (True, world.pool_id)
    again = await world.maintenance.set("n1", True, "disk swap", "operator/k1")
    assert not again.changed
    (alert,) = world.alerts.alerts
    assert (alert.kind, alert.by, alert.details) == (
        "node.maintenance", "operator/k1", {"maintenance": True},
    )  # fmt: skip
    node = await world.ledger.catalog.node("n1")
    assert node is not None and node.state.maintenance


async def test_a_unit_of_work_left_without_commit_writes_nothing(world: World) -> None:
    held = await world.reservations.create(world.request(1, "r"))
    assert isinstance(held, Created)
    rid = held.reservation.reservation_id
    async with world.ledger.transaction() as uow:
        await uow.reservations.release(rid, "acme", world.clock.now_ms())
    res = await world.ledger.reservations.get(rid, "acme")
    assert res.state(world.clock.now_ms()) == "active"
    async with world.ledger.transaction() as uow:
        await uow.commit()
        with pytest.raises(RuntimeError, match="once"):
            await uow.commit()
