"""The bookings each agent is told (SPEC §10, issue 24): a running coordinator on SQLite
and PostgreSQL, real NATS, reservations made over HTTP. What is booked on a node reaches
that node's bookings subject after the commit, and no other node's; a heartbeat whose
etag differs gets the node's bookings again, at most once per re-send period; the clock
alone (a booking starting) changes them too; another replica computes the same etag;
and after a walk of creates, releases and time passing every agent holds what a fresh
replica computes."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import nats
from nats.aio.client import Client
from nats.aio.msg import Msg

from coordinator.app import Coordinator
from coordinator.domain.node_bookings import EMPTY_ETAG
from coordinator.services.node_bookings import NodeBookingsBroadcast
from coordinator.services.node_records import record_inventory
from shared.clock import FakeClock
from shared.subjects import Subjects
from shared.wire import NodeBookings
from tests.factories import make_heartbeat, make_inventory
from tests.fakes import RecordingPublisher
from tests.integration.conftest import Api, Served
from tests.waiting import eventually

HOUR = 3_600_000
MINUTE = 60_000


class Heard:
    def __init__(self) -> None:
        self.by_node: dict[str, list[NodeBookings]] = {}

    async def add(self, msg: Msg) -> None:
        value = NodeBookings.from_json(msg.data)
        self.by_node.setdefault(value.node_id, []).append(value)

    def count(self, node: str) -> int:
        return len(self.by_node.get(node, []))

    def last(self, node: str) -> NodeBookings:
        return self.by_node[node][-1]


async def _setup(c: Coordinator, api: Api) -> tuple[str, Client, Heard]:
    await api.ok("tenants.create", {"tenantId": "acme"})
    pool = str((await api.ok("pools.create", {"tenantId": "acme", "name": "p"}))["poolId"])
    for node in ("n0", "n1"):
        await record_inventory(c.ledger, make_inventory(node, pool, gpus=4, disks=1), 1)
    nc = await nats.connect(c.settings.nats.url)
    heard = Heard()
    await nc.subscribe(Subjects(c.settings.nats.subject_prefix).bookings("*", "*"), cb=heard.add)
    await nc.flush()
    broadcast = c.bookings
    assert broadcast is not None

    await eventually(holds(lambda: broadcast.loaded))
    assert broadcast.sent.total() == 0  # the first read publishes nothing
    return pool, nc, heard


def holds(predicate: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return predicate()

    return check


def _req(pool: str, key: str, count: int, **extra: Any) -> dict[str, Any]:
    return {
        "tenantId": "acme",
        "poolId": pool,
        "devices": [{"class": "gpu", "count": count}],
        "duration": "1h",
        "idempotencyKey": key,
    } | extra


async def _heartbeat(c: Coordinator, nc: Client, pool: str, node: str, etag: str, seq: int) -> None:
    inv = make_inventory(node, pool, gpus=4, disks=1)
    hb = msgspec.structs.replace(make_heartbeat(inv, seq), bookings_etag=etag)
    await nc.publish(Subjects(c.settings.nats.subject_prefix).heartbeat(pool, node), hb.to_json())
    await nc.flush()


async def test_a_booking_reaches_its_node_only_and_a_stale_etag_gets_it_again(
    clocked: Coordinator, capi: Api, clock: FakeClock
) -> None:
    c = clocked
    pool, nc, heard = await _setup(c, capi)
    broadcast = c.bookings
    assert broadcast is not None
    try:
        made = await capi.ok("reservations.create", _req(pool, "k1", 3))
        await eventually(holds(lambda: heard.count("n0") == 1))
        got = heard.last("n0")
        assert got.node_id == "n0" and len(got.bookings) == 1
        booking = got.bookings[0]
        assert (booking.reservation_id, booking.tenant_id, booking.state) == (
            made["reservationId"], "acme", "active",
        )  # fmt: skip
        assert (booking.start, booking.end) == (made["start"], made["end"])
        booked = sorted(a["atomId"].rsplit(":", 1)[1] for a in made["atoms"])
        assert sorted(d.device_id for d in booking.devices) == booked
        assert {d.cls for d in booking.devices} == {"gpu"}
        assert got.etag == broadcast.etag_of("n0") != EMPTY_ETAG
        assert heard.count("n1") == 0  # nothing changed there

        # An agent that holds the etag is left alone; one that does not is sent the
        # node's bookings again, once per re-send period however often it asks.
        await _heartbeat(c, nc, pool, "n0", got.etag, 1)
        await _heartbeat(c, nc, pool, "n1", "", 1)
        await eventually(holds(lambda: heard.count("n1") == 1))
        assert heard.last("n1").bookings == () and heard.last("n1").etag == EMPTY_ETAG
        # A heartbeat sent before the change arrived is not answered with a re-send.
        await _heartbeat(c, nc, pool, "n0", "stale", 2)
        await asyncio.sleep(1.5)  # three ticks
        assert heard.count("n0") == 1
        clock.advance(broadcast.resend_every_ms)
        await _heartbeat(c, nc, pool, "n0", "stale", 3)
        await eventually(holds(lambda: heard.count("n0") == 2))
        assert heard.last("n0").etag == got.etag and heard.last("n0").bookings == got.bookings
        await _heartbeat(c, nc, pool, "n0", "stale", 4)
        await asyncio.sleep(1.5)
        assert heard.count("n0") == 2 and broadcast.sent["resend"] == 2
        clock.advance(broadcast.resend_every_ms)
        await _heartbeat(c, nc, pool, "n0", "stale", 5)
        await eventually(holds(lambda: heard.count("n0") == 3))

        # Released: the node is told it holds nothing.
        await capi.ok(
            "reservations.release", {"tenantId": "acme", "reservationId": made["reservationId"]}
        )
        await eventually(holds(lambda: heard.last("n0").bookings == ()))
        assert heard.last("n0").etag == EMPTY_ETAG
    finally:
        await nc.close()


async def test_a_future_booking_turns_active_by_the_clock_and_replicas_agree(
    clocked: Coordinator, capi: Api, clock: FakeClock
) -> None:
    c = clocked
    pool, nc, heard = await _setup(c, capi)
    try:
        now = clock.now_ms()
        made = await capi.ok("reservations.create", _req(pool, "later", 2, start=now + HOUR))
        await eventually(holds(lambda: heard.count("n0") == 1))
        assert heard.last("n0").bookings[0].state == "scheduled"

        # Another replica reading the same ledger computes the same etag.
        other = NodeBookingsBroadcast(c.ledger, Subjects(c.settings.nats.subject_prefix), clock,
                                      RecordingPublisher())  # fmt: skip
        await other.tick()
        assert other.etag_of("n0") == heard.last("n0").etag

        clock.advance(HOUR)
        await eventually(holds(lambda: heard.count("n0") == 2))
        active = heard.last("n0").bookings[0]
        assert (active.reservation_id, active.state) == (made["reservationId"], "active")
    finally:
        await nc.close()


async def test_every_change_reaches_the_agents_as_a_fresh_replica_computes_it(
    served: Served,
) -> None:
    """A seeded walk of creates (now and later), releases and time passing: after each
    tick, what each agent holds (the last message for its node, nothing before the
    first) is what a replica starting now computes, for every node of the pool."""
    api, ledger, clock = served.api, served.ledger, served.clock
    await api.ok("tenants.create", {"tenantId": "acme"})
    pool = str((await api.ok("pools.create", {"tenantId": "acme", "name": "p"}))["poolId"])
    nodes = ("n0", "n1", "n2")
    for node in nodes:
        await record_inventory(ledger, make_inventory(node, pool, gpus=4), 1)
    bus = RecordingPublisher()
    broadcast = NodeBookingsBroadcast(ledger, Subjects(), clock, bus)
    await broadcast.tick()
    held: dict[str, str] = {}
    live: list[str] = []
    sent = 0
    booked_steps = 0
    rng = random.Random(24)
    for step in range(24):
        roll = rng.random()
        if roll < 0.5:
            later = rng.choice([0, 0, 20 * MINUTE])
            body = _req(pool, f"k{step}", rng.randint(1, 3), start=clock.now_ms() + later)
            status, made = await api.call("reservations.create", body)
            if status == 200:
                live.append(made["reservationId"])
        elif roll < 0.75 and live:
            rid = live.pop(rng.randrange(len(live)))
            await api.call("reservations.release", {"tenantId": "acme", "reservationId": rid})
        else:
            clock.advance(rng.choice([5, 25, 45]) * MINUTE)
        await broadcast.tick()
        for subject, payload in bus.sent:
            message = NodeBookings.from_json(payload)
            assert subject == Subjects().bookings(pool, message.node_id)
            held[message.node_id] = message.etag
        sent += len(bus.sent)
        bus.sent.clear()
        fresh = NodeBookingsBroadcast(ledger, Subjects(), clock, RecordingPublisher())
        await fresh.tick()
        expected = {node: fresh.etag_of(node) for node in nodes}
        assert {node: held.get(node, EMPTY_ETAG) for node in nodes} == expected, step
        booked_steps += any(etag != EMPTY_ETAG for etag in expected.values())
    assert sent >= 10 and booked_steps >= 10  # the walk moved the bookings often
