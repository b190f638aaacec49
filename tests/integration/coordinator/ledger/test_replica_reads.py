"""A follower replica serves reads from its own snapshot (SPEC §7): after the leader
records nodes and books and releases through its API, the follower — whose pool
snapshot was warmed before each of those writes — answers summary, byPool, preview,
timeline, reservations get/list and nodes get/list exactly as the leader does, because
each read checks the ledger's version counters and reloads what moved."""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any

import aiohttp
import nats
import pytest

from coordinator.app import running_coordinator
from shared.clock import FakeClock
from shared.subjects import Subjects
from tests.factories import make_inventory
from tests.integration.conftest import Api, coordinator_settings
from tests.waiting import eventually

GPUS = {
    "tenantId": "acme",
    "devices": [{"class": "gpu", "count": 3}],
    "duration": "1h",
    "idempotencyKey": "try",
}


async def _reads(api: Api, pool: str, rids: list[str]) -> dict[str, Any]:
    """Every read the SPEC has followers serve, as one replica answers it."""
    acme = {"tenantId": "acme"}
    out: dict[str, Any] = {
        "summary": await api.ok("capacity.summary", acme),
        "byPool": await api.ok("capacity.byPool", acme | {"poolId": pool}),
        "timeline": await api.ok("capacity.timeline", acme | {"poolId": pool}),
        "reservations.list": await api.ok("reservations.list", acme),
        "nodes.list": await api.ok("nodes.list", acme | {"poolId": pool}),
    }
    for count in (1, 3, 5, 8):
        body = GPUS | {"poolId": pool, "devices": [{"class": "gpu", "count": count}]}
        out[f"preview {count}"] = await api.ok("capacity.preview", body)
    for rid in rids:
        out[rid] = await api.ok("reservations.get", acme | {"reservationId": rid})
    for node in ("n1", "n2"):
        out[node] = await api.ok("nodes.get", acme | {"nodeId": node})
    return out


async def test_a_follower_answers_reads_as_the_leader_after_its_writes(
    database_url: str, nats_url: str
) -> None:
    if not database_url.startswith("postgresql"):
        pytest.skip("replicas share a PostgreSQL ledger")
    settings = coordinator_settings(database_url, nats_url)
    clock = FakeClock(1_800_000_000_000)  # one clock: answers that say "now" agree
    async with AsyncExitStack() as stack:
        leader = await stack.enter_async_context(running_coordinator(settings, clock))
        follower = await stack.enter_async_context(running_coordinator(settings, clock))
        assert [leader.leadership.is_leader, follower.leadership.is_leader] == [True, False]
        session = await stack.enter_async_context(aiohttp.ClientSession())
        key = settings.bootstrap_operator_key
        assert key
        a, b = Api(session, leader.url, key), Api(session, follower.url, key)
        await a.ok("tenants.create", {"tenantId": "acme"})
        pool = (await a.ok("pools.create", {"tenantId": "acme", "name": "p"}))["poolId"]
        # The follower's snapshot of the empty pool, loaded before the leader writes.
        assert not (await b.ok("capacity.preview", GPUS | {"poolId": pool}))["fits"]

        nc = await nats.connect(nats_url)
        stack.push_async_callback(nc.close)
        s = Subjects(settings.nats.subject_prefix)
        for node in ("n1", "n2"):
            inv = make_inventory(node, pool, gpus=4)
            await nc.publish(s.inventory(pool, node), inv.to_json())

        async def registered() -> bool:
            page = await b.ok("nodes.list", {"tenantId": "acme", "poolId": pool})
            return len(page["nodes"]) == 2

        await eventually(registered)
        assert (await b.ok("capacity.preview", GPUS | {"poolId": pool}))["fits"]

        # The leader books; the follower's warm snapshot is now behind the ledger.
        rids = []
        for k in range(2):
            body = GPUS | {"poolId": pool, "idempotencyKey": f"k{k}"}
            rids.append((await a.ok("reservations.create", body))["reservationId"])
        seen = await _reads(b, pool, rids)
        assert seen == await _reads(a, pool, rids)
        assert not seen["preview 3"]["fits"]  # 1 + 1 GPUs left: the follower knows it
        assert seen["preview 1"]["fits"]

        await b.ok("capacity.preview", GPUS | {"poolId": pool})  # warm again
        await a.ok("reservations.release", {"tenantId": "acme", "reservationId": rids[0]})
        seen = await _reads(b, pool, rids)
        assert seen == await _reads(a, pool, rids)
        assert seen["preview 3"]["fits"] and not seen["preview 5"]["fits"]
        assert seen[rids[0]]["state"] == "released"
