"""A GPU in unbooked use is not free (issue 31, point 6): a process no booking covers,
reported through the real use path (a use report on nats), puts its GPU last in line.
Preview and create take the idle GPU first; a request that needs the busy one too gets
it, with a warning naming it, and preview says the same."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import nats
import pytest

from coordinator.app import Coordinator, running_coordinator
from shared.clock import FakeClock
from tests.integration.conftest import Api, coordinator_settings
from tests.integration.coordinator.services.use_agent import Agent, gpu, on_the_bus
from tests.waiting import eventually


@pytest.fixture
async def used(database_url: str, nats_url: str, clock: FakeClock) -> AsyncIterator[Coordinator]:
    settings = coordinator_settings(
        database_url, nats_url, use_interval_s=0.05, use_flush_s=0, reservation_tick_s=0.05
    )
    async with running_coordinator(settings, clock) as c:
        yield c


def gpus_of(answer: dict[str, object]) -> list[str]:
    atoms = answer["atoms"]
    assert isinstance(atoms, list)
    return sorted(str(a["atomId"]).split(":gpu:", 1)[1] for a in atoms)


async def test_a_gpu_in_unbooked_use_is_offered_last_with_a_warning(
    used: Coordinator, clock: FakeClock
) -> None:
    async with on_the_bus(used) as (nc, _session, api, _key):
        agent = await Agent.registered(used, nc, api, gpus=2)
        pool = agent.inv.pool_id
        where = {"tenantId": "acme", "poolId": pool}
        assert "unbookedBusy" not in await api.ok("capacity.byPool", where)
        # A pod nobody booked runs on GPU 0, the one the placer would take first.
        busy, idle = "GPU-n1-0", "GPU-n1-1"
        await agent.report(gpu(busy, ("pod-7", "pod")), gpu(idle))
        (unbooked,) = await agent.wait_for("gpu.unbookedUse")
        assert unbooked.device_id == busy
        # The rollup says so beside its rows; the gpu row itself keeps its shape.
        rows = await api.ok("capacity.byPool", where)
        assert rows["unbookedBusy"] == 1
        gpu_row = next(r for r in rows["rows"] if r["resource"] == "gpu")
        assert (gpu_row["allocatable"], gpu_row["available"]) == (2, 2)
        (summary,) = (await api.ok("capacity.summary", {"tenantId": "acme"}))["pools"]
        assert summary["unbookedBusy"] == 1

        def ask(n: int, key: str) -> dict[str, object]:
            return {
                "tenantId": "acme", "poolId": pool, "devices": [{"class": "gpu", "count": n}],
                "duration": "1h", "idempotencyKey": key,
            }  # fmt: skip

        one = await api.ok("capacity.preview", ask(1, "p1"))
        assert gpus_of(one["candidates"][0]) == [idle]
        assert "warnings" not in one
        two = await api.ok("capacity.preview", ask(2, "p2"))
        assert gpus_of(two["candidates"][0]) == [busy, idle]
        assert len(two["warnings"]) == 1 and busy in two["warnings"][0]

        r1 = await api.ok("reservations.create", ask(1, "r1"))
        assert gpus_of(r1) == [idle]
        assert "warnings" not in r1
        await api.ok(
            "reservations.release", {"tenantId": "acme", "reservationId": r1["reservationId"]}
        )
        r2 = await api.ok("reservations.create", ask(2, "r2"))
        assert gpus_of(r2) == [busy, idle]
        assert len(r2["warnings"]) == 1 and busy in r2["warnings"][0]
        # A retry is the first answer, warning included.
        assert await api.ok("reservations.create", ask(2, "r2")) == r2

        # Booked now: the pod's GPU is no longer in unbooked use.
        async def covered() -> bool:
            return "unbookedBusy" not in await api.ok("capacity.byPool", where)

        await eventually(covered)


async def test_a_replica_that_is_not_the_leader_places_a_busy_gpu_last_too(
    database_url: str, nats_url: str
) -> None:
    if not database_url.startswith("postgresql"):
        pytest.skip("replicas share a PostgreSQL ledger")
    settings = coordinator_settings(database_url, nats_url, use_interval_s=0.05, use_flush_s=0)
    async with (
        running_coordinator(settings) as a,
        running_coordinator(settings) as b,
        aiohttp.ClientSession() as session,
    ):
        assert [a.leadership.is_leader, b.leadership.is_leader] == [True, False]
        key = settings.bootstrap_operator_key
        assert key is not None
        api_b = Api(session, b.url, key)
        nc = await nats.connect(nats_url)
        agent = await Agent.registered(a, nc, api_b, gpus=2)
        pool = agent.inv.pool_id
        await agent.report(gpu("GPU-n1-0", ("pod-7", "pod")), gpu("GPU-n1-1"))
        await agent.wait_for("gpu.unbookedUse")
        ask = {
            "tenantId": "acme", "poolId": pool, "devices": [{"class": "gpu", "count": 1}],
            "duration": "1h", "idempotencyKey": "p1",
        }  # fmt: skip

        async def idle_first() -> bool:
            seen = await api_b.ok("capacity.preview", ask)
            return gpus_of(seen["candidates"][0]) == ["GPU-n1-1"]

        await eventually(idle_first)
        where = {"tenantId": "acme", "poolId": pool}
        assert (await api_b.ok("capacity.byPool", where))["unbookedBusy"] == 1
        created = await api_b.ok("reservations.create", ask | {"idempotencyKey": "r1"})
        assert gpus_of(created) == ["GPU-n1-1"]
        await nc.close()
