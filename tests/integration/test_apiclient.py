"""The typed clients against a running coordinator: a call, every page of
reservations.list, a refusal raised as `ApiError` with code, message and details (both
conventions), and 503s retried with backoff (a local server that answers 503 twice)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from aiohttp import web

from coordinator.app import Coordinator
from coordinator.services.node_changes import record_inventory
from ops.apiclient import ApiError, AsyncClient, Client, Retry
from tests.factories import make_inventory

Q = 900_000
FAST = Retry(attempts=4, backoff_s=0.01)


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def _fleet(coordinator: Coordinator) -> tuple[str, str]:
    """A tenant with a pool of two 4-GPU nodes; its pool id and API key."""
    key = coordinator.settings.bootstrap_operator_key
    assert key is not None
    async with AsyncClient(coordinator.url, key) as operator:
        await operator.tenants.create({"tenantId": "acme"})
        pool = (await operator.pools.create({"tenantId": "acme", "name": "p"}))["poolId"]
        for i in range(2):
            await record_inventory(coordinator.ledger, make_inventory(f"n{i}", pool, gpus=4), 1)
        tenant_key = (await operator.api_keys.create({"tenantId": "acme"}))["key"]
    return pool, tenant_key


def _sync_flow(url: str, key: str, pool: str) -> None:
    client = Client(url, key, retry=FAST)
    assert client.api_keys.self_()["tenantId"] == "acme"
    ids = []
    for i in range(5):
        res = client.reservations.create(
            {"tenantId": "acme", "poolId": pool, "devices": [{"class": "gpu", "count": 1}],
             "duration": "1h", "idempotencyKey": f"sync-{i}"}
        )  # fmt: skip
        assert res["state"] == "active"
        ids.append(res["reservationId"])
    pages = client.reservations.list_iter({"tenantId": "acme", "limit": 2})
    listed = [r["reservationId"] for r in pages]
    assert listed == ids[::-1]  # newest first, across three pages

    with pytest.raises(ApiError) as missing:
        client.reservations.get({"tenantId": "acme", "reservationId": "rsv_" + "0" * 26})
    assert (missing.value.status, missing.value.code) == (404, "NOT_FOUND")
    assert "not found" in missing.value.message and missing.value.details == {}
    with pytest.raises(ApiError) as invalid:
        client.reservations.list({"tenantId": "acme", "limit": 0})
    assert invalid.value.code == "INVALID_INPUT"
    assert [f["path"] for f in invalid.value.details["fields"]] == ["limit"]

    start = (int(datetime.now(UTC).timestamp() * 1000) // Q + 4) * Q
    one = {"startsAt": iso(start), "endsAt": iso(start + Q), "capacityGb": 16}
    booked = client.intervals.reserve({"intervals": [one]}, idempotency_key="iv", pool_id=pool)
    window = (iso(start - 86_400_000), iso(start + Q))
    assert [r["reservationId"] for r in client.intervals.list_iter(*window, limit=1)] == [
        booked["reservationId"]
    ]
    with pytest.raises(ApiError) as refused:
        client.intervals.reserve({"intervals": [one | {"capacityGb": 1 << 20}]}, pool_id=pool)
    assert (refused.value.status, refused.value.code) == (409, "capacity_not_available")
    assert refused.value.details["intervals"][0]["reason"] == "insufficient_capacity"
    with pytest.raises(ApiError) as rule:
        client.intervals.reserve({"intervals": [one | {"capacityGb": 5}]}, pool_id=pool)
    assert (rule.value.status, rule.value.code) == (400, "INVALID_REQUEST")
    assert "multiple of 4" in rule.value.message


async def test_the_sync_client_calls_pages_and_raises_typed_errors(
    coordinator: Coordinator,
) -> None:
    pool, key = await _fleet(coordinator)
    # urllib blocks: off the loop the coordinator answers on.
    await asyncio.to_thread(_sync_flow, coordinator.url, key, pool)


async def test_the_async_client_calls_pages_and_raises_typed_errors(
    coordinator: Coordinator,
) -> None:
    pool, key = await _fleet(coordinator)
    async with AsyncClient(coordinator.url, key, retry=FAST) as client:
        ids = []
        for i in range(5):
            res = await client.reservations.create(
                {"tenantId": "acme", "poolId": pool, "devices": [{"class": "gpu", "count": 1}],
                 "duration": 3600, "idempotencyKey": f"async-{i}"}
            )  # fmt: skip
            ids.append(res["reservationId"])
        listed = [
            r["reservationId"]
            async for r in client.reservations.list_iter({"tenantId": "acme", "limit": 2})
        ]
        assert listed == ids[::-1]
        paged = client.nodes.list_iter({"tenantId": "acme", "limit": 1})
        nodes = [n["nodeId"] async for n in paged]
        assert nodes == ["n0", "n1"]
        with pytest.raises(ApiError) as refused:
            await client.reservations.create(
                {"tenantId": "acme", "poolId": pool, "devices": [{"class": "gpu", "count": 64}],
                 "duration": "1h", "idempotencyKey": "too-big"}
            )  # fmt: skip
        assert (refused.value.status, refused.value.code) == (409, "CAPACITY_NOT_AVAILABLE")
        assert refused.value.details["devices"][0]["requested"] == 64
        with pytest.raises(ApiError) as denied:
            await client.tenants.list()
        assert (denied.value.status, denied.value.code) == (403, "PERMISSION_DENIED")


@pytest.fixture
async def flaky() -> AsyncIterator[tuple[str, list[str]]]:
    """A server that answers 503 twice, then what the coordinator would (`apiKeys.self`);
    `/always` answers 503 every time."""
    hits: list[str] = []

    async def handler(request: web.Request) -> web.Response:
        hits.append(request.path)
        if request.path.startswith("/always") or len(hits) <= 2:
            envelope = {"error": {"code": "UNAVAILABLE", "message": "not the leader",
                                  "details": {}}}  # fmt: skip
            return web.json_response(envelope, status=503, headers={"Retry-After": "0"})
        return web.json_response(
            {"keyId": "k", "tenantId": "acme", "roles": ["tenant"], "operator": False}
        )

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}", hits
    finally:
        await runner.cleanup()


async def test_both_clients_retry_a_503_with_backoff_then_give_up_typed(
    flaky: tuple[str, list[str]],
) -> None:
    url, hits = flaky
    me = await asyncio.to_thread(lambda: Client(url, "k", retry=FAST).api_keys.self_())
    assert me["tenantId"] == "acme" and len(hits) == 3
    hits.clear()
    async with AsyncClient(url, "k", retry=FAST) as client:
        assert (await client.api_keys.self_())["operator"] is False
        assert len(hits) == 3
        with pytest.raises(ApiError) as gave_up:
            async with AsyncClient(url + "/always", "k", retry=Retry(2, 0.01)) as always:
                await always.tenants.list()
    assert (gave_up.value.status, gave_up.value.code) == (503, "UNAVAILABLE")
    hits.clear()
    with pytest.raises(ApiError) as sync_gave_up:
        await asyncio.to_thread(
            lambda: Client(url + "/always", "k", retry=Retry(2, 0.01)).tenants.list()
        )
    assert sync_gave_up.value.code == "UNAVAILABLE" and len(hits) == 2
