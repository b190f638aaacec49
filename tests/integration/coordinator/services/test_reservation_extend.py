"""`reservations.extend` below HTTP (issue 34): a booking's end moves on the same devices
only where they are free for the added time and the tenant's quotas have room; a
refusal changes nothing. Real ledger (SQLite and PostgreSQL), fake clock."""

from __future__ import annotations

import pytest

from coordinator.domain.errors import CapacityNotAvailable, InvalidInput, NotFound, QuotaExceeded
from coordinator.domain.model import Quota
from coordinator.domain.reservation import Reservation
from coordinator.ledger import Ledger
from coordinator.services.node_records import record_heartbeat, record_inventory
from coordinator.services.reservations import Created
from shared.ids import new_pool_id
from shared.wire import DeviceHealth
from tests.factories import make_heartbeat, make_inventory
from tests.integration.coordinator.services.test_services import HOUR, World


@pytest.fixture
async def world(ledger: Ledger) -> World:
    pool_id = new_pool_id()
    w = World(ledger, pool_id)
    now = w.clock.now_ms()
    for tenant in ("acme", "globex"):
        await ledger.tenants.create(tenant, tenant.title(), now)
    await ledger.pools.create(pool_id, "p", "acme", None, now)
    await record_inventory(ledger, make_inventory("n1", pool_id, gpus=4), now)
    return w


async def _book(world: World, gpus: int, key: str, **extra: object) -> Reservation:
    out = await world.reservations.create(world.request(gpus, key, **extra))
    assert isinstance(out, Created), out
    return out.reservation


async def _stored(world: World, res: Reservation) -> Reservation:
    return await world.ledger.reservations.get(res.reservation_id, None)


async def test_a_free_booking_is_extended_on_its_own_gpus(world: World) -> None:
    two = await _book(world, 2, "two")
    moved = await world.reservations.extend("acme", two.reservation_id, two.end + HOUR)
    assert (moved.previous_end, moved.reservation.end) == (two.end, two.end + HOUR)
    stored = await _stored(world, two)
    assert stored.end == two.end + HOUR and stored.atoms == two.atoms
    # Its GPUs are held for the added hour: all four then no longer fit, two do.
    late = await world.reservations.create(world.request(4, "late", start=two.end))
    assert not isinstance(late, Created)
    other = await _book(world, 2, "other", start=two.end)
    assert not {a.atom_id for a in other.atoms} & {a.atom_id for a in two.atoms}
    # The same end again changes nothing; an earlier one (not past now) gives time back.
    again = await world.reservations.extend("acme", two.reservation_id, two.end + HOUR)
    assert again.previous_end == again.reservation.end == two.end + HOUR
    shorter = await world.reservations.extend("acme", two.reservation_id, two.end)
    assert (await _stored(world, two)).end == shorter.reservation.end == two.end
    assert isinstance(
        await world.reservations.create(world.request(2, "after", start=two.end)), Created
    )


async def test_a_dry_run_decides_and_changes_nothing(world: World) -> None:
    one = await _book(world, 1, "one")
    tried = await world.reservations.extend(
        "acme", one.reservation_id, one.end + HOUR, dry_run=True
    )
    assert tried.reservation.end == one.end + HOUR
    assert (await _stored(world, one)).end == one.end
    await _book(world, 4, "all-later", start=one.end)
    with pytest.raises(CapacityNotAvailable):
        await world.reservations.extend("acme", one.reservation_id, one.end + 1000, dry_run=True)


async def test_a_booking_of_its_gpus_after_it_refuses_the_extension(world: World) -> None:
    mine = await _book(world, 2, "mine")
    theirs = await _book(world, 4, "theirs", start=mine.end + HOUR // 2)
    with pytest.raises(CapacityNotAvailable) as refused:
        await world.reservations.extend("acme", mine.reservation_id, mine.end + HOUR)
    blocked = refused.value.details["blocked"]
    assert {b["atomId"] for b in blocked} == {a.atom_id for a in mine.atoms}
    assert theirs.reservation_id not in str(refused.value.details)  # never named
    assert (await _stored(world, mine)).end == mine.end
    assert (await _stored(world, theirs)).end == theirs.end
    # Up to where the other booking starts it is free.
    moved = await world.reservations.extend("acme", mine.reservation_id, theirs.start)
    assert moved.reservation.end == theirs.start


async def test_an_extension_over_quota_is_refused_and_changes_nothing(world: World) -> None:
    first = await _book(world, 2, "first")
    await _book(world, 2, "longer", duration="2h")  # the other two GPUs, an hour longer
    await world.ledger.quotas.set(Quota("acme", None, "gpu", 3), world.clock.now_ms())
    with pytest.raises(QuotaExceeded) as refused:
        await world.reservations.extend("acme", first.reservation_id, first.end + HOUR)
    assert refused.value.details == {
        "resource": "gpu", "poolId": None, "limit": 3, "used": 2, "requested": 2,
    }  # fmt: skip
    assert (await _stored(world, first)).end == first.end


async def test_a_tenant_extends_only_its_own_bookings(world: World) -> None:
    mine = await _book(world, 1, "acmes")
    with pytest.raises(NotFound):
        await world.reservations.extend("globex", mine.reservation_id, mine.end + HOUR)
    assert (await _stored(world, mine)).end == mine.end


@pytest.mark.parametrize(
    ("shift", "kind"),
    [(1500, "grid"), (-2 * HOUR, "past"), (400 * 24 * HOUR, "range")],
)
async def test_an_end_off_the_grid_or_in_the_past_is_refused(
    world: World, shift: int, kind: str
) -> None:
    """Whole seconds after the start (a booking's length is whole seconds), after now,
    within the longest booking: otherwise INVALID_INPUT naming `end`, nothing changed."""
    one = await _book(world, 1, "one")
    with pytest.raises(InvalidInput) as refused:
        await world.reservations.extend("acme", one.reservation_id, one.end + shift)
    assert refused.value.details["fields"][0] | {"message": ""} == {
        "path": "end", "message": "", "type": kind,
    }  # fmt: skip
    assert (await _stored(world, one)).end == one.end


async def test_an_ended_booking_cannot_move(world: World) -> None:
    one = await _book(world, 1, "one")
    await world.reservations.release("acme", one.reservation_id)
    with pytest.raises(InvalidInput, match="no longer live"):
        await world.reservations.extend("acme", one.reservation_id, one.end + HOUR)


async def _sick(world: World, *devices: str) -> None:
    """Node n1 reports these GPUs unhealthy (the others healthy again)."""
    inv = make_inventory("n1", world.pool_id, gpus=4)
    faults = tuple(DeviceHealth(device_id=d, status="unhealthy") for d in devices)
    await record_heartbeat(world.ledger, make_heartbeat(inv, devices=faults), world.clock.now_ms())


async def test_time_on_a_gpu_gone_unhealthy_or_a_held_node_is_refused(world: World) -> None:
    """An extension is judged as a create of the same devices over the added time: a
    GPU gone unhealthy is one the placer never gives, so more time on it is refused
    (CAPACITY_NOT_AVAILABLE naming the atom), as is any time on a node in maintenance;
    nothing changes, and giving time back still goes."""
    two = await _book(world, 2, "two")
    sick = two.atoms[0]
    await _sick(world, sick.atom_id.split(":gpu:", 1)[1])
    with pytest.raises(CapacityNotAvailable) as refused:
        await world.reservations.extend("acme", two.reservation_id, two.end + HOUR)
    assert refused.value.details["blocked"] == [
        {"nodeId": "n1", "atomId": sick.atom_id, "reason": "its device is unhealthy"}
    ]
    with pytest.raises(CapacityNotAvailable):  # a dry run says the same
        await world.reservations.extend("acme", two.reservation_id, two.end + HOUR, dry_run=True)
    stored = await _stored(world, two)
    assert stored.end == two.end and stored.at_risk is not None
    assert stored.at_risk.reason == "unhealthy"
    shorter = await world.reservations.extend("acme", two.reservation_id, two.end - 60_000)
    assert (await _stored(world, two)).end == shorter.reservation.end == two.end - 60_000
    # Healthy again: it grows; then its node goes into maintenance: refused again.
    await _sick(world)
    grown = await world.reservations.extend("acme", two.reservation_id, two.end + HOUR)
    assert grown.reservation.end == two.end + HOUR
    await world.maintenance.set("n1", True, "swap PSU", "ops")
    with pytest.raises(CapacityNotAvailable) as held:
        await world.reservations.extend("acme", two.reservation_id, two.end + 2 * HOUR)
    assert {(b["atomId"], b["reason"]) for b in held.value.details["blocked"]} == {
        (a.atom_id, "its node is maintenance") for a in two.atoms
    }
    assert (await _stored(world, two)).end == two.end + HOUR


async def test_a_whole_node_with_a_faulty_gpu_is_extended_at_risk_as_it_was_booked(
    world: World,
) -> None:
    """A whole-node booking takes the node's faulty devices too (a create books it, at
    risk): its extension goes through the same way, and the answer says it is at risk."""
    await _sick(world, "GPU-n1-3")
    whole = await _book(world, 1, "whole", devices=[{"class": "node", "count": 1}])
    assert whole.at_risk is not None and whole.at_risk.reason == "unhealthy"
    moved = await world.reservations.extend("acme", whole.reservation_id, whole.end + HOUR)
    assert moved.reservation.end == whole.end + HOUR
    assert moved.reservation.at_risk is not None
    assert moved.reservation.at_risk.reason == "unhealthy"
