"""Real answers validate against the served OpenAPI document: a representative call of
every method (both conventions) and their failures, each checked with jsonschema
against the response schema declared for its status (closed schemas: an undeclared
field fails)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from coordinator.api.methods import REGISTRY
from coordinator.app import Coordinator
from coordinator.services.node_records import record_inventory
from shared.clock import FakeClock
from tests.factories import make_inventory
from tests.integration.conftest import Api
from tests.openapi_check import check_answer

Q = 900_000


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Answers:
    """Calls the API and checks each answer against the document as it goes."""

    def __init__(self, api: Api, document: dict[str, Any]) -> None:
        self.api = api
        self.document = document
        self.checked: set[tuple[str, int]] = set()

    async def _check(self, name: str, status: int, content_type: str, raw: bytes) -> Any:
        body = json.loads(raw) if content_type == "application/json" else raw.decode()
        check_answer(self.document, name, status, content_type, body)
        self.checked.add((name, status))
        return body

    async def call(self, name: str, body: Any, key: str | None = None, want: int = 200) -> Any:
        module, method = name.split(".", 1)
        headers = {"Authorization": f"Bearer {key or self.api.operator_key}"}
        url = f"{self.api.base}/api/compute/{module}/{method}"
        async with self.api.session.post(url, json=body, headers=headers) as resp:
            assert resp.status == want, (name, resp.status, await resp.text())
            return await self._check(name, resp.status, resp.content_type, await resp.read())

    async def rest(
        self, name: str, key: str, want: int = 200, body: Any = None,
        headers: dict[str, str] | None = None, **query: str,
    ) -> Any:  # fmt: skip
        method = REGISTRY.get(name)
        assert method is not None
        async with self.api.session.request(
            method.verb, self.api.base + method.path, params=query, json=body,
            headers={"X-API-Key": key} | (headers or {}),
        ) as resp:  # fmt: skip
            assert resp.status == want, (name, resp.status, await resp.text())
            return await self._check(name, resp.status, resp.content_type, await resp.read())


async def test_every_methods_answers_match_the_served_response_schemas(
    capi: Api, clocked: Coordinator, clock: FakeClock
) -> None:
    async with capi.session.get(f"{capi.base}/api/openapi.json") as resp:
        document = await resp.json()
    a = Answers(capi, document)
    now = clock.now_ms()

    # operators: tenants, keys, pools, quotas
    for tenant in ("acme", "globex"):
        await a.call("tenants.create", {"tenantId": tenant, "name": tenant.title()})
    await a.call("tenants.list", {})
    acme = (await a.call("apiKeys.create", {"tenantId": "acme", "label": "ci"}))["key"]
    globex = (await a.call("apiKeys.create", {"tenantId": "globex"}))["key"]
    spare = await a.call("apiKeys.create", {"tenantId": "acme", "roles": ["tenant"]})
    await a.call("apiKeys.revoke", {"keyId": spare["keyId"]})
    await a.call("apiKeys.list", {"tenantId": "acme", "includeRevoked": True})
    await a.call("apiKeys.self", {}, acme)
    await a.call("projects.create", {"tenantId": "acme", "name": "llm"}, acme)
    await a.call("projects.create", {"tenantId": "acme", "name": "llm"}, acme, want=409)
    await a.call("projects.list", {"tenantId": "acme"}, acme)
    pool = (await a.call("pools.create", {"tenantId": "acme", "name": "a", "gpuModel": "H100"}))[
        "poolId"
    ]
    other = (await a.call("pools.create", {"tenantId": "acme", "name": "old"}))["poolId"]
    await a.call("pools.archive", {"tenantId": "acme", "poolId": other}, acme)
    await a.call("quotas.set", {"tenantId": "acme", "resource": "gpu", "limit": 64})
    await a.call("quotas.set", {"tenantId": "acme", "poolId": pool, "resource": "vcpu",
                                "limit": 512})  # fmt: skip
    for i in range(2):
        inventory = make_inventory(f"n{i}", pool, gpus=2, labels={"rack": "r1"})
        await record_inventory(clocked.ledger, inventory, now)

    # reservations and what they show in capacity, nodes and usage
    ref = {"tenantId": "acme", "poolId": pool}
    request = ref | {"devices": [{"class": "gpu", "count": 1}], "duration": "2h"}
    booked = await a.call(
        "reservations.create",
        request | {"idempotencyKey": "k1", "leaseSeconds": 600, "resources": {"vcpu": 4}},
        acme,
    )
    await a.call("reservations.create", request | {"idempotencyKey": "k2", "spot": True,
                                                   "start": now + 3_600_000}, acme)  # fmt: skip
    await a.call("reservations.create", request | {"idempotencyKey": "k3", "gang": {"size": 2}},
                 acme)  # fmt: skip
    refused = request | {"devices": [{"class": "gpu", "count": 64}], "idempotencyKey": "k4"}
    await a.call("reservations.create", refused, acme, want=409)
    rid = {"tenantId": "acme", "reservationId": booked["reservationId"]}
    await a.call("reservations.get", rid, acme)
    await a.call("reservations.renew", rid | {"leaseSeconds": 900}, acme)
    later = rid | {"end": booked["end"] + 3_600_000}
    await a.call("reservations.extend", later | {"dryRun": True}, acme)
    await a.call("reservations.extend", later | {"end": booked["end"] + 1}, acme, want=400)
    await a.call("reservations.extend", later, acme)
    await a.call("reservations.list", {"tenantId": "acme", "limit": 2}, acme)
    tried = request | {"idempotencyKey": "try"}
    await a.call("capacity.preview", tried, acme)
    await a.call("capacity.preview", tried | {"devices": [{"class": "gpu", "count": 64}]}, acme)
    await a.call("capacity.timeline", ref, acme)
    await a.call("capacity.summary", {"tenantId": "acme"}, acme)
    await a.call("capacity.fleet", {})
    await a.call("capacity.byPool", ref, acme)
    await a.call("pools.capacity", ref, acme)
    await a.call("pools.get", ref, acme)
    await a.call("pools.list", {"tenantId": "acme"}, acme)
    await a.call("pools.offer", ref | {"offerTo": "globex"}, acme)
    await a.call("nodes.get", {"tenantId": "acme", "nodeId": "n0"}, acme)
    await a.call("nodes.get", {"tenantId": "globex", "nodeId": "n0"}, globex)  # held: other
    await a.call("gpus.list", {"tenantId": "globex", "limit": 2}, globex)  # held: other
    await a.call("pools.unoffer", ref | {"offerTo": "globex"}, acme)
    await a.call("nodes.list", {"tenantId": "acme", "poolId": pool, "limit": 1}, acme)
    await a.call("nodes.inventories", {"poolId": pool, "limit": 1})
    await a.call("nodes.setMaintenance", {"nodeId": "n1", "maintenance": True, "reason": "psu"})
    await a.call("nodes.events", {"tenantId": "acme", "nodeId": "n1"}, acme)
    await a.call("nodes.setExpectedShape", {"poolId": pool, "counts": {"gpu": 1}})
    await record_inventory(clocked.ledger, make_inventory("n2", pool, gpus=2), now)
    await a.call("nodes.get", {"nodeId": "n2"})  # held: a provisioning reason
    await a.call("nodes.acceptShape", {"nodeId": "n2"})
    await a.call("nodes.replace", {"oldNodeId": "n1", "newNodeId": "n2"})
    await a.call("reservations.release", rid, acme)
    await a.call("usage.report", {"tenantId": "acme"}, acme)

    # the envelope
    await a.call("reservations.get", {"tenantId": "acme"}, acme, want=400)
    await a.call("capacity.summary", {"tenantId": "acme"}, "not-a-key", want=401)
    await a.call("capacity.summary", {"tenantId": "globex"}, acme, want=403)
    await a.call("pools.get", {"tenantId": "acme", "poolId": "pool_" + "0" * 26}, acme, want=404)
    await a.call("tenants.create", {"tenantId": "acme"}, want=409)

    # seed 002: the interval API in its own words
    start = (now // Q + 4) * Q
    one = {"startsAt": iso(start), "endsAt": iso(start + Q), "capacityGb": 16}
    key = {"Idempotency-Key": "iv-1"}
    await a.rest("intervals.reserve", acme, body={"intervals": [one]}, headers=key, poolId=pool)
    two = {"intervals": [one, one | {"startsAt": iso(start + Q), "endsAt": iso(start + 2 * Q)}]}
    await a.rest("intervals.reserve", acme, 409, body=two, headers=key, poolId=pool)
    huge = {"intervals": [one | {"capacityGb": 4096}]}
    refusal = await a.rest("intervals.reserve", acme, 409, body=huge, poolId=pool)
    assert refusal["error"] == "capacity_not_available"
    await a.rest("intervals.reserve", acme, 400, body={"intervals": [one | {"capacityGb": 5}]},
                 poolId=pool)  # fmt: skip
    window = {"from": iso(now - 3_600_000), "to": iso(now + 3_600_000)}
    await a.rest("intervals.list", acme, limit="1", **window)
    grid = {"from": iso(start), "to": iso(start + 2 * Q)}
    await a.rest("intervals.calendar", acme, poolId=pool, **grid)
    await a.rest("intervals.calendar", acme, 404, poolId="pool_" + "0" * 26, **grid)
    await a.rest("intervals.calendar", "not-a-key", 401, poolId=pool, **grid)
    await a.rest("capacity.consumption", acme, poolId=pool, **grid)
    await a.rest("capacity.consumption", acme, 403, tenantId="globex", **grid)
    await a.call("usage.consumption", {"tenantId": "acme", "from": now, "to": now + Q}, acme)
    await a.call("usage.export", {"tenantId": "acme", "from": start, "to": start + Q}, acme)

    assert {name for name, status in a.checked if status == 200} == {m.name for m in REGISTRY}
