"""The `observer` role (issue 32): what the Slurm bridge, dashboards and scrapers use
instead of an operator key. It reads every tenant's reservations, pools and nodes and
the coordinator's /metrics, and every method that writes (or administers) answers 403."""

from __future__ import annotations

from typing import Any

from coordinator.api.http.openapi import example
from coordinator.api.methods import REGISTRY
from coordinator.services.node_records import record_inventory
from tests.factories import make_inventory
from tests.integration.conftest import Api, Served


async def _fleet(api: Api, served: Served) -> dict[str, Any]:
    for tenant in ("acme", "globex"):
        await api.ok("tenants.create", {"tenantId": tenant})
    a = (await api.ok("pools.create", {"tenantId": "acme", "name": "a"}))["poolId"]
    b = (await api.ok("pools.create", {"tenantId": "globex", "name": "b"}))["poolId"]
    await record_inventory(served.ledger, make_inventory("a0", a, gpus=2), 1)
    await record_inventory(served.ledger, make_inventory("b0", b, gpus=2), 1)
    acme = (await api.ok("apiKeys.create", {"tenantId": "acme"}))["key"]
    booking = {
        "tenantId": "acme", "poolId": a, "devices": [{"class": "gpu", "count": 1}],
        "duration": "1h", "idempotencyKey": "obs-1",
    }  # fmt: skip
    rsv = (await api.ok("reservations.create", booking, acme))["reservationId"]
    observer = await api.ok(
        "apiKeys.create", {"tenantId": "globex", "roles": ["observer"], "label": "bridge"}
    )
    return {"a": a, "b": b, "rsv": rsv, "observer": observer["key"]}


def _write_body(name: str, pool: str) -> dict[str, Any]:
    """A body that passes validation, for another tenant than the key's: a refusal is
    then about the key's role, not the input."""
    method = REGISTRY.get(name)
    assert method is not None
    schema = method.input.model_json_schema(by_alias=True)
    body = example(schema, schema.get("$defs", {}), full=False)
    assert isinstance(body, dict)
    if name == "nodes.setExpectedShape":  # poolId or a profile: a rule of its own
        body["poolId"] = pool
    body = body | ({"tenantId": "acme"} if "tenantId" in body else {})
    method.input.model_validate(body)
    return body


async def test_an_observer_reads_every_tenant_and_every_write_is_403(served: Served) -> None:
    api = served.api
    f = await _fleet(api, served)
    key = f["observer"]
    # Every tenant's reservations, the bridge's read (no tenantId: all of them).
    listed = await api.ok("reservations.list", {}, key)
    assert [r["reservationId"] for r in listed["reservations"]] == [f["rsv"]]
    got = await api.ok("reservations.get", {"tenantId": "acme", "reservationId": f["rsv"]}, key)
    assert got["tenantId"] == "acme"
    # Nodes in any tenant's pool, with who holds what.
    nodes = await api.ok("nodes.list", {"limit": 10}, key)
    assert {n["nodeId"] for n in nodes["nodes"]} == {"a0", "b0"}
    for tenant, pool in (("acme", f["a"]), ("globex", f["b"])):
        await api.ok("pools.get", {"tenantId": tenant, "poolId": pool}, key)
        await api.ok("nodes.list", {"tenantId": tenant, "poolId": pool}, key)
    await api.ok("nodes.get", {"nodeId": "a0"}, key)
    me = await api.ok("apiKeys.self", {}, key)
    assert me["roles"] == ["observer"] and me["operator"] is False
    # A scraper's /metrics.
    async with api.session.get(
        f"{api.base}/metrics", headers={"Authorization": f"Bearer {key}"}
    ) as resp:
        assert resp.status == 200

    writes = [m for m in REGISTRY if m.kind == "write" or m.permission == "platform:admin"]
    named = {m.name for m in writes}
    assert {"reservations.create", "reservations.release", "nodes.setMaintenance",
            "apiKeys.create", "tenants.create", "intervals.reserve"} <= named  # fmt: skip
    answers = {}
    for method in writes:
        if method.convention == "compute":
            status, payload = await api.call(method.name, _write_body(method.name, f["a"]), key)
        else:
            async with api.session.request(
                method.verb, api.base + method.path, json={},
                headers={"Authorization": f"Bearer {key}"},
            ) as resp:  # fmt: skip
                status, payload = resp.status, await resp.json()
        answers[method.name] = (status, payload)
    assert {n: s for n, (s, _) in answers.items() if s != 403} == {}
    # Nothing changed: the reservation is still there, no tenant or key was made.
    assert (await api.ok("reservations.get", {"tenantId": "acme", "reservationId": f["rsv"]}))[
        "state"
    ] != "released"
    tenants = await api.ok("tenants.list", {})
    assert {t["tenantId"] for t in tenants["tenants"]} == {"operator", "acme", "globex"}


async def test_an_observer_key_has_no_other_role(served: Served) -> None:
    """Read-only goes alone: tenant + observer would write for its tenant while reading
    every other's."""
    api = served.api
    await api.ok("tenants.create", {"tenantId": "acme"})
    status, payload = await api.call(
        "apiKeys.create", {"tenantId": "acme", "roles": ["tenant", "observer"]}
    )
    assert status == 400, payload
    assert "roles" in payload["error"]["message"]
    keys = await api.ok("apiKeys.list", {"tenantId": "acme"})
    assert keys["keys"] == []
