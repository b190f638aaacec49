"""Idempotent replay comes first (SPEC §5, truth under change): a retry with the same
key and body gets the recorded answer even when the request would no longer validate,
the pool is part of the hashed request, and one key used in two pools at once is one
key — never a 500. And the calendar body exactly as SPEC §5 states it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from coordinator.app import Coordinator
from coordinator.services.node_records import record_inventory
from shared.clock import FakeClock
from tests.factories import make_inventory
from tests.integration.conftest import Api
from tests.integration.coordinator.api.test_intervals import Rest, iso, iv
from tests.rig import rollup_rows_held, waiting_on_locks

T0 = 1_800_000_000_000
MINUTE = 60_000


async def _pools(api: Api, c: Coordinator, count: int) -> tuple[list[str], str]:
    await api.ok("tenants.create", {"tenantId": "acme"})
    pools = []
    for i in range(count):
        pool = (await api.ok("pools.create", {"tenantId": "acme", "name": f"p{i}"}))["poolId"]
        await record_inventory(c.ledger, make_inventory(f"n{i}", pool, memory_gib=512), 1)
        pools.append(pool)
    key = (await api.ok("apiKeys.create", {"tenantId": "acme"}))["key"]
    return pools, key


@pytest.fixture
async def two(capi: Api, clocked: Coordinator) -> tuple[Rest, list[str]]:
    pools, key = await _pools(capi, clocked, 2)
    return Rest(capi.session, capi.base, key), pools


async def test_an_interval_retry_after_the_lead_time_ran_out_gets_the_recorded_answer(
    two: tuple[Rest, list[str]], clock: FakeClock
) -> None:
    client, (pool, _) = two
    body = {"intervals": [iv(-2)], "poolId": pool}  # 30 minutes from now
    status, first = await client.post(body, idem="lead")
    assert status == 200, first
    clock.advance(20 * MINUTE)
    assert await client.post(body, idem="lead") == (200, first)


async def test_a_compute_retry_after_its_start_passed_gets_the_recorded_answer(
    capi: Api, clocked: Coordinator, clock: FakeClock
) -> None:
    (pool,), key = await _pools(capi, clocked, 1)
    body = {
        "tenantId": "acme", "poolId": pool, "devices": [{"class": "gpu", "count": 1}],
        "start": T0 + 10 * MINUTE, "duration": "1h", "idempotencyKey": "started",
    }  # fmt: skip
    first = await capi.ok("reservations.create", body, key)
    clock.advance(20 * MINUTE)
    assert await capi.call("reservations.create", body, key) == (200, first)
    # A new key with that start is validated as usual.
    status, err = await capi.call("reservations.create", body | {"idempotencyKey": "n"}, key)
    assert (status, err["error"]["code"]) == (400, "INVALID_INPUT")


async def test_the_pool_in_the_query_is_part_of_the_hashed_request(
    two: tuple[Rest, list[str]],
) -> None:
    client, (a, b) = two
    body = {"intervals": [iv(0)]}
    status, _ = await client.post(body, idem="same", pool=a)
    assert status == 200
    status, again = await client.post(body, idem="same", pool=b)
    assert (status, again["error"]) == (409, "idempotency_key_conflict")
    status, _ = await client.post(body, idem="same", pool=a)
    assert status == 200


async def test_one_key_in_two_pools_at_once_is_one_key(
    two: tuple[Rest, list[str]], capi: Api, clocked: Coordinator
) -> None:
    client, (a, b) = two
    url = clocked.settings.effective_database_url
    if not url.startswith("postgresql"):
        pytest.skip("SQLite admits one writer at a time")
    async with rollup_rows_held(url, a, b):
        racing = [
            asyncio.create_task(client.post({"intervals": [iv(0)]}, idem="twice", pool=p))
            for p in (a, b)
        ]
        await waiting_on_locks(url, 2)
    answers = await asyncio.gather(*racing)
    assert sorted(status for status, _ in answers) == [200, 409], answers
    assert [body["error"] for status, body in answers if status == 409] == [
        "idempotency_key_conflict"
    ]

    def create(pool: str) -> dict[str, Any]:
        return {
            "tenantId": "acme", "poolId": pool, "devices": [{"class": "gpu", "count": 1}],
            "duration": "1h", "idempotencyKey": "twice",
        }  # fmt: skip

    async with rollup_rows_held(url, a, b):
        racing = [
            asyncio.create_task(capi.call("reservations.create", create(p), client.key))
            for p in (a, b)
        ]
        await waiting_on_locks(url, 2)
    answers = await asyncio.gather(*racing)
    assert sorted(status for status, _ in answers) == [200, 409], answers
    codes = [body["error"]["code"] for status, body in answers if status == 409]
    assert codes == ["IDEMPOTENCY_KEY_CONFLICT"]


async def test_the_calendar_body_is_the_specs(two: tuple[Rest, list[str]]) -> None:
    client, (pool, _) = two
    q = 900_000
    status, cal = await client.get(
        "/api/capacity/calendar", **{"from": iso(T0 - 2 * q), "to": iso(T0 + q), "poolId": pool}
    )
    assert status == 200, cal
    assert cal == {
        "from": iso(T0 - 2 * q),
        "to": iso(T0 + q),
        "resource": "memory_gb",
        "intervals": [
            {
                "startsAt": iso(t),
                "endsAt": iso(t + q),
                "reservationLimitGb": 512,
                "reservedGb": 0,
                "reservableGb": 512,
            }
            for t in (T0 - 2 * q, T0 - q, T0)
        ],
    }
