"""Two coordinator replicas on one PostgreSQL (SPEC §7): one leader writes what the
heartbeats imply, the other takes over when it goes, bookings stay safe through both."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack

import aiohttp
import nats
import pytest
from sqlalchemy import select

from coordinator.app import Coordinator, running_coordinator
from coordinator.ledger import schema
from shared.subjects import Subjects
from shared.wire import DeviceHealth
from tests.database import database
from tests.factories import make_heartbeat, make_inventory
from tests.integration.conftest import Api, coordinator_settings
from tests.waiting import eventually


async def _events(c: Coordinator, kind: str) -> list[str]:
    e = schema.node_events.c
    async with database(c.settings.effective_database_url) as db, db.read() as conn:
        rows = await conn.execute(select(e.node_id).where(e.kind == kind))
        return [r[0] for r in rows.all()]


@pytest.mark.timeout(240)  # a failover on a loaded machine; see the wait below
async def test_two_replicas_one_leader_failover_and_safe_bookings(
    database_url: str, nats_url: str
) -> None:
    if not database_url.startswith("postgresql"):
        pytest.skip("replicas share a PostgreSQL ledger")
    settings = coordinator_settings(database_url, nats_url, recovery_hold_s=0.2, misses=3)
    async with AsyncExitStack() as outer:
        leader_stack = AsyncExitStack()
        a = await leader_stack.enter_async_context(running_coordinator(settings))
        b = await outer.enter_async_context(running_coordinator(settings))
        outer.push_async_callback(leader_stack.aclose)
        assert [a.leadership.is_leader, b.leadership.is_leader] == [True, False]
        session = await outer.enter_async_context(aiohttp.ClientSession())
        key = settings.bootstrap_operator_key
        assert key
        api_a, api_b = Api(session, a.url, key), Api(session, b.url, key)
        await api_b.ok("tenants.create", {"tenantId": "acme"})
        pool = (await api_b.ok("pools.create", {"tenantId": "acme", "name": "p"}))["poolId"]

        s = Subjects(settings.nats.subject_prefix)
        nc = await nats.connect(nats_url)
        outer.push_async_callback(nc.close)
        n1, n2 = make_inventory("n1", pool, gpus=8), make_inventory("n2", pool, gpus=8)
        for inv in (n1, n2):
            await nc.publish(s.inventory(pool, inv.node_id), inv.to_json())

        async def both_registered() -> bool:
            return len(await _events(a, "node.registered")) == 2

        await eventually(both_registered)
        sick = (DeviceHealth(device_id="GPU-n1-0", status="unhealthy"),)
        first = make_heartbeat(n1, 1, devices=sick, interval_ms=5000)
        await nc.publish(s.heartbeat(pool, "n1"), first.to_json())

        async def one_fault() -> bool:
            return await _events(a, "device.unhealthy") == ["n1"]

        await eventually(one_fault)
        await asyncio.sleep(0.5)
        # Both replicas heard it; it was written once, by the leader.
        assert await _events(a, "device.unhealthy") == ["n1"]
        assert b.ingest.accepted["hb"] == a.ingest.accepted["hb"] == 1

        # From here both nodes beat as live agents do (5 s interval, 15 s window), so
        # neither leader may mark them while the bookings and the failover take their
        # time on a loaded machine; n2 falls silent just before the leader goes.
        n2_beats = asyncio.Event()
        n2_beats.set()
        seqs = {"n1": 10, "n2": 10}

        async def agents() -> None:
            while True:
                for inv in (n1, n2):
                    if inv is n2 and not n2_beats.is_set():
                        continue
                    seqs[inv.node_id] += 1
                    hb = make_heartbeat(
                        inv, seqs[inv.node_id], devices=sick if inv is n1 else (),
                        interval_ms=5000,
                    )  # fmt: skip
                    await nc.publish(s.heartbeat(pool, inv.node_id), hb.to_json())
                await asyncio.sleep(0.5)

        beating = asyncio.create_task(agents(), name="agents")

        async def stop_beating() -> None:
            beating.cancel()
            await asyncio.gather(beating, return_exceptions=True)

        outer.push_async_callback(stop_beating)

        async def both_at_5s(c: Coordinator) -> bool:
            return all(c.tracker.nodes[n].interval_ms == 5000 for n in ("n1", "n2"))

        await eventually(lambda: both_at_5s(a))

        # Bookings through both replicas at once never share an atom.
        body = {
            "tenantId": "acme", "poolId": pool, "devices": [{"class": "gpu", "count": 3}],
            "duration": "1h",
        }  # fmt: skip
        answers = await asyncio.gather(
            *(
                (api_a if k % 2 else api_b).call(
                    "reservations.create", body | {"idempotencyKey": f"k{k}"}
                )
                for k in range(8)
            )
        )
        booked = [atom["atomId"] for st, out in answers if st == 200 for atom in out["atoms"]]
        assert len(booked) == len(set(booked)) == 12  # 7 + 8 healthy GPUs, 3 on one node

        # The leader goes; the follower takes over and is the one to judge liveness.
        n2_beats.clear()
        await leader_stack.aclose()
        assert await _events(b, "node.unreachable") == []  # nobody marked before

        async def took_over() -> bool:
            return b.leadership.is_leader

        await eventually(took_over)
        await eventually(lambda: both_at_5s(b))
        for node in b.tracker.nodes.values():
            node.quiet_until = 0  # past the startup window, as in production after 15 s

        async def n2_caught() -> bool:
            return "n2" in await _events(b, "node.unreachable")

        # 15 s after n2's last word at the earliest; generous, since a loaded machine
        # (CI beside other work) can stretch the takeover and the sweeps.
        await eventually(n2_caught, within_s=75)
        assert await _events(b, "node.unreachable") == ["n2"]
