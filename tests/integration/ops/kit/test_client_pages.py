"""Both API clients walk a listing's pages the same way, over real HTTP to the API on a
real ledger (SQLite and PostgreSQL): every cursor followed to the end, each item once;
the synchronous walk stops asking when its caller has enough (`gpufleet reservations
--limit`)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import msgspec

from coordinator.services.node_records import record_inventory
from ops.kit.async_client import AsyncApiClient
from ops.kit.client import ApiClient
from tests.factories import make_inventory
from tests.integration.conftest import Served


class _NodePage(msgspec.Struct, rename="camel"):
    nodes: list[dict[str, Any]]
    next_cursor: str | None = None


class _Counting(ApiClient):
    calls = 0

    def call(self, method: str, body: dict[str, Any]) -> Any:
        self.calls += 1
        return super().call(method, body)


async def test_both_clients_follow_every_cursor_and_a_caller_may_stop_early(
    served: Served,
) -> None:
    await served.api.ok("tenants.create", {"tenantId": "acme"})
    pool = (await served.api.ok("pools.create", {"tenantId": "acme", "name": "p"}))["poolId"]
    for node in ("n0", "n1", "n2"):
        await record_inventory(
            served.ledger, make_inventory(node, pool, gpus=1), served.clock.now_ms()
        )
    one_a_page = {"limit": 1}

    sync = _Counting(served.api.base, served.api.operator_key)
    pages = await asyncio.to_thread(lambda: list(sync.pages("nodes.list", one_a_page)))
    assert [[n["nodeId"] for n in p["nodes"]] for p in pages] == [["n0"], ["n1"], ["n2"]]
    assert "cursor" not in one_a_page  # the caller's body is left as it was
    async with aiohttp.ClientSession() as http:
        client = AsyncApiClient(http, served.api.base, served.api.operator_key)
        typed = await client.pages("nodes.list", one_a_page, _NodePage)
    assert [[n["nodeId"] for n in p.nodes] for p in typed] == [["n0"], ["n1"], ["n2"]]

    def first_only() -> list[str]:
        for page in sync.pages("nodes.list", one_a_page):
            return [n["nodeId"] for n in page["nodes"]]
        return []

    sync.calls = 0
    assert await asyncio.to_thread(first_only) == ["n0"]
    assert sync.calls == 1
