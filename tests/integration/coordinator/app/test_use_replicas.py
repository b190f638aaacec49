"""Use conditions across a leader change (issue 34), two replicas on one PostgreSQL: the
old leader says a pod's unbooked use and a reservation's idleness; the new leader goes
on from the ledger, so a NATS subscriber (the console feed, the forwarder) hears each
once, and each ends once when its cause goes."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack, suppress

import aiohttp
import nats
import pytest

from coordinator.app import running_coordinator
from shared.wire import Alert
from tests.integration.conftest import Api, coordinator_settings
from tests.integration.coordinator.services.use_agent import Agent, gpu, unit, use_passes
from tests.waiting import eventually


def _count(alerts: list[Alert], kind: str) -> int:
    """Alerts of `kind` said, by id: the outbox relay publishes at least once (a leader
    that stops between publishing and marking an alert sent leaves it to the next), and
    a plain subscriber sees each publish; JetStream and every consumer dedupe by id."""
    return len({a.alert_id for a in alerts if a.kind == kind})


@pytest.mark.timeout(240)
async def test_a_new_leader_says_no_use_condition_again_and_ends_each_once(
    database_url: str, nats_url: str
) -> None:
    if not database_url.startswith("postgresql"):
        pytest.skip("replicas share a PostgreSQL ledger")
    settings = coordinator_settings(
        database_url, nats_url, use_interval_s=0.1, idle_after_s=1, use_flush_s=0,
        recovery_hold_s=0.2,
    )  # fmt: skip
    async with AsyncExitStack() as outer:
        leader_stack = AsyncExitStack()
        a = await leader_stack.enter_async_context(running_coordinator(settings))
        b = await outer.enter_async_context(running_coordinator(settings))
        outer.push_async_callback(leader_stack.aclose)
        assert [a.leadership.is_leader, b.leadership.is_leader] == [True, False]
        session = await outer.enter_async_context(aiohttp.ClientSession())
        key = settings.bootstrap_operator_key
        assert key
        api = Api(session, b.url, key)
        nc = await nats.connect(nats_url)
        outer.push_async_callback(nc.close)
        agent = await Agent.registered(b, nc, api, gpus=2)
        pool = agent.inv.pool_id
        r = await api.ok(
            "reservations.create",
            {
                "tenantId": "acme", "poolId": pool, "devices": [{"class": "gpu", "count": 1}],
                "duration": "2h", "idempotencyKey": "r",
            },
        )  # fmt: skip
        rid, held = str(r["reservationId"]), unit(r)
        (free,) = {f"GPU-n1-{i}" for i in range(2)} - {held}

        async def beating() -> None:
            while True:
                await agent.beat_same_use()
                await asyncio.sleep(0.2)

        beats = asyncio.create_task(beating())
        outer.callback(beats.cancel)
        # A pod on the GPU nobody booked; the booked one idle.
        await agent.report(gpu(free, ("ml/train-0", "pod")), gpu(held))
        await agent.wait_for("gpu.unbookedUse")
        await agent.wait_for("reservation.idle")

        # The leader goes; the other replica leads and makes its passes.
        await leader_stack.aclose()

        async def took_over() -> bool:
            return b.leadership.is_leader

        await eventually(took_over, within_s=30)
        await use_passes(b, 10, within_s=30)  # well past idle_after_s (1 s) and many passes
        assert _count(agent.alerts, "gpu.unbookedUse") == 1
        assert _count(agent.alerts, "reservation.idle") == 1

        # The pod stops and the reservation works: each ends once, said by the new leader.
        await agent.report(gpu(free), gpu(held, (rid, "reservation"), util=90))
        await agent.wait_for("gpu.unbookedUseEnded")
        await agent.wait_for("reservation.inUse")
        await use_passes(b, 5, within_s=30)
        assert _count(agent.alerts, "gpu.unbookedUseEnded") == 1
        assert _count(agent.alerts, "reservation.inUse") == 1
        assert b.gpu_use is not None and b.gpu_use.idle == ()
        assert await b.ledger.gpu_use.conditions() == []
        beats.cancel()
        with suppress(asyncio.CancelledError):
            await beats
