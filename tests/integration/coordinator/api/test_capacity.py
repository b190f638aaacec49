"""capacity.summary and capacity.byPool, authentication, the envelope on the wire and the
OpenAPI document, over HTTP to the in-process app, on SQLite and PostgreSQL. The
constraint table is tests/unit/coordinator/api/test_inputs.py."""

from __future__ import annotations

from typing import Any

import msgspec

from coordinator.api.methods import REGISTRY
from coordinator.domain.model import RESOURCES
from coordinator.ledger import Ledger
from coordinator.services.node_records import record_inventory
from tests.database import database
from tests.factories import make_inventory
from tests.integration.conftest import Api, Served


async def _fleet(api: Api, ledger: Ledger) -> dict[str, Any]:
    for tenant in ("acme", "globex", "initech"):
        await api.ok("tenants.create", {"tenantId": tenant})
    h100 = await api.ok("pools.create", {"tenantId": "acme", "name": "h", "gpuModel": "H100"})
    plain = await api.ok("pools.create", {"tenantId": "acme", "name": "plain"})
    other = await api.ok("pools.create", {"tenantId": "globex", "name": "g", "gpuModel": "H100"})
    await api.ok(
        "pools.offer", {"tenantId": "acme", "poolId": plain["poolId"], "offerTo": "globex"}
    )
    await record_inventory(ledger, make_inventory("h1", h100["poolId"], gpus=8), 1)
    await record_inventory(ledger, make_inventory("h2", h100["poolId"], gpus=8, mig=7), 1)
    await record_inventory(ledger, make_inventory("p1", plain["poolId"], gpus=4), 1)
    await record_inventory(ledger, make_inventory("g1", other["poolId"], gpus=2), 1)
    keys = {
        t: (await api.ok("apiKeys.create", {"tenantId": t}))["key"]
        for t in ("acme", "globex", "initech")
    }
    return {
        "h100": h100["poolId"],
        "plain": plain["poolId"],
        "other": other["poolId"],
        "keys": keys,
    }


async def test_summary_lists_owned_and_offered_pools_with_rows_and_gpu_models(
    served: Served,
) -> None:
    api = served.api
    f = await _fleet(api, served.ledger)
    acme = await api.ok("capacity.summary", {"tenantId": "acme"}, f["keys"]["acme"])
    assert acme["tenantId"] == "acme"
    assert {p["poolId"] for p in acme["pools"]} == {f["h100"], f["plain"]}
    for pool in acme["pools"]:
        assert [r["resource"] for r in pool["capacity"]] == sorted(RESOURCES)
        assert pool["owner"] == "acme"
    h100 = next(p for p in acme["pools"] if p["poolId"] == f["h100"])
    gpu = next(r for r in h100["capacity"] if r["resource"] == "gpu")
    assert (gpu["total"], gpu["allocatable"], gpu["available"]) == (16, 16, 16)
    mig = next(r for r in h100["capacity"] if r["resource"] == "gpu.mig")
    assert mig["total"] == 7
    # Only gpu rows, per model; a pool without a model counts as "other".
    assert acme["byGpuModel"] == {
        "H100": {"total": 16, "allocatable": 16, "allocated": 0, "reserved": 0, "available": 16},
        "other": {"total": 4, "allocatable": 4, "allocated": 0, "reserved": 0, "available": 4},
    }
    globex = await api.ok("capacity.summary", {"tenantId": "globex"}, f["keys"]["globex"])
    assert {p["poolId"] for p in globex["pools"]} == {f["plain"], f["other"]}
    assert globex["byGpuModel"]["H100"]["total"] == 2
    assert globex["byGpuModel"]["other"]["total"] == 4
    initech = await api.ok("capacity.summary", {"tenantId": "initech"}, f["keys"]["initech"])
    assert initech == {"tenantId": "initech", "pools": [], "byGpuModel": {}}


async def test_archived_pools_vanish_for_everyone_but_their_owner(
    served: Served,
) -> None:
    api = served.api
    f = await _fleet(api, served.ledger)
    await served.ledger.pools.archive(f["plain"])
    globex = await api.ok("capacity.summary", {"tenantId": "globex"}, f["keys"]["globex"])
    assert {p["poolId"] for p in globex["pools"]} == {f["other"]}
    status, body = await api.call(
        "capacity.byPool", {"tenantId": "globex", "poolId": f["plain"]}, f["keys"]["globex"]
    )
    assert (status, body["error"]["code"]) == (404, "NOT_FOUND")
    acme = await api.ok("capacity.summary", {"tenantId": "acme"}, f["keys"]["acme"])
    archived = next(p for p in acme["pools"] if p["poolId"] == f["plain"])
    assert archived["archived"] is True
    rows = await api.ok(
        "capacity.byPool", {"tenantId": "acme", "poolId": f["plain"]}, f["keys"]["acme"]
    )
    assert rows["poolId"] == f["plain"]


async def test_by_pool_returns_rows_ordered_by_resource_and_hides_foreign_pools(
    served: Served,
) -> None:
    api = served.api
    f = await _fleet(api, served.ledger)
    body = await api.ok(
        "capacity.byPool", {"tenantId": "globex", "poolId": f["plain"]}, f["keys"]["globex"]
    )
    assert [r["resource"] for r in body["rows"]] == sorted(RESOURCES)
    gpu = next(r for r in body["rows"] if r["resource"] == "gpu")
    assert set(gpu) == {
        "resource", "total", "allocatable", "allocated", "reserved", "available",
        "provisioning", "unhealthy", "maintenance", "unreachable", "updatedAt",
    }  # fmt: skip
    assert gpu["total"] == 4
    for tenant, pool in (("globex", f["h100"]), ("initech", f["plain"]), ("acme", f["other"])):
        status, err = await api.call(
            "capacity.byPool", {"tenantId": tenant, "poolId": pool}, f["keys"][tenant]
        )
        assert (status, err["error"]["code"]) == (404, "NOT_FOUND"), (tenant, pool)
    missing = "pool_" + "0" * 26
    status, err = await api.call(
        "capacity.byPool", {"tenantId": "acme", "poolId": missing}, f["keys"]["acme"]
    )
    assert status == 404
    # The error never tells a pool that exists apart from one that does not.
    _, err2 = await api.call(
        "capacity.byPool", {"tenantId": "initech", "poolId": f["h100"]}, f["keys"]["initech"]
    )
    assert err["error"]["message"].replace(missing, "X") == err2["error"]["message"].replace(
        f["h100"], "X"
    )


async def test_bad_bodies_reach_the_wire_as_invalid_input_envelopes_not_500(
    served: Served,
) -> None:
    api = served.api
    for raw in (b"", b"{not json", b"[1,2]", b'"acme"', b"null"):
        status, err = await api.call("capacity.summary", None, raw=raw)
        assert (status, err["error"]["code"]) == (400, "INVALID_INPUT"), raw
    status, err = await api.call("capacity.byPool", {"tenantId": "acme", "poolId": None})
    assert status == 400
    assert err["error"]["code"] == "INVALID_INPUT"
    assert err["error"]["message"] == "invalid input: poolId"
    assert [f["path"] for f in err["error"]["details"]["fields"]] == ["poolId"]


async def test_authentication_and_tenant_authorization(served: Served) -> None:
    api = served.api
    f = await _fleet(api, served.ledger)
    status, err = await api.call("capacity.summary", {"tenantId": "acme"}, key="gpf_nope")
    assert (status, err["error"]["code"]) == (401, "UNAUTHENTICATED")
    async with api.session.post(
        f"{api.base}/api/compute/capacity/summary", json={"tenantId": "acme"}
    ) as resp:
        assert resp.status == 401
    async with api.session.post(
        f"{api.base}/api/compute/capacity/summary",
        json={"tenantId": "acme"},
        headers={"X-API-Key": f["keys"]["acme"]},
    ) as resp:
        assert resp.status == 200
    status, err = await api.call("capacity.summary", {"tenantId": "globex"}, f["keys"]["acme"])
    assert (status, err["error"]["code"]) == (403, "PERMISSION_DENIED")
    status, err = await api.call("tenants.create", {"tenantId": "evil"}, f["keys"]["acme"])
    assert (status, err["error"]["code"]) == (403, "PERMISSION_DENIED")
    # Operators act for any tenant.
    await api.ok("capacity.summary", {"tenantId": "globex"})


async def test_a_revoked_key_stops_working_at_once(served: Served) -> None:
    api = served.api
    await api.ok("tenants.create", {"tenantId": "acme"})
    created = await api.ok("apiKeys.create", {"tenantId": "acme"})
    await api.ok("capacity.summary", {"tenantId": "acme"}, created["key"])
    await api.ok("apiKeys.revoke", {"keyId": created["keyId"]})
    status, err = await api.call("capacity.summary", {"tenantId": "acme"}, created["key"])
    assert (status, err["error"]["code"]) == (401, "UNAUTHENTICATED")


async def test_keys_are_stored_hashed(served: Served) -> None:
    api = served.api
    await api.ok("tenants.create", {"tenantId": "acme"})
    created = await api.ok("apiKeys.create", {"tenantId": "acme"})
    secret = created["key"].split("_", 2)[2]
    from sqlalchemy import select

    from coordinator.ledger import schema

    async with database(served.database_url) as db, db.read() as conn:
        rows = (await conn.execute(select(schema.api_keys))).all()
    assert rows and all(secret not in " ".join(map(str, r)) for r in rows)


async def test_openapi_is_generated_from_the_registry(served: Served) -> None:
    api = served.api
    async with api.session.get(f"{api.base}/api/openapi.json") as resp:
        doc = await resp.json()
    ops = {op["operationId"]: op for path in doc["paths"].values() for op in path.values()}
    assert set(ops) == {m.name for m in REGISTRY}
    summary = ops["capacity.summary"]
    assert summary["x-gpufleet"]["permission"] == "compute:capacity:read"
    assert summary["x-gpufleet"]["scope"] == "compute-tenant"
    assert ops["capacity.byPool"]["x-gpufleet"]["scope"] == "compute-pool"
    schema_ref = summary["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    schema = doc["components"]["schemas"][schema_ref.rsplit("/", 1)[1]]
    assert schema["properties"]["tenantId"]["maxLength"] == 128
    # The seed-002 routes come from the same registry, with their own conventions.
    assert {"get", "post"} <= set(doc["paths"]["/api/capacity/reservations"])
    calendar = doc["paths"]["/api/capacity/calendar"]["get"]
    assert calendar["operationId"] == "intervals.calendar"
    assert {(p["name"], p["in"], p["required"]) for p in calendar["parameters"]} == {
        ("from", "query", True), ("to", "query", True), ("poolId", "query", False),
        ("tenantId", "query", False),
    }  # fmt: skip
    post = doc["paths"]["/api/capacity/reservations"]["post"]
    assert ("Idempotency-Key", "header") in {(p["name"], p["in"]) for p in post["parameters"]}
    assert "text/plain" in post["responses"]["400"]["content"]


def _of_model(inv: Any, model: str) -> Any:
    """The inventory with its GPUs reporting `model`."""
    atoms = [
        msgspec.structs.replace(a, attrs=a.attrs | {"model": model}) if a.cls == "gpu" else a
        for a in inv.atoms
    ]
    return msgspec.structs.replace(inv, atoms=atoms)


async def test_a_mixed_pool_counts_its_gpus_per_reported_model(served: Served) -> None:
    """byGpuModel keeps a pool without a model under `other` (seed 000); in the fleet
    view the pool's own gpuModels splits it by the models its agents report, booked now
    and later."""
    api, ledger = served.api, served.ledger
    await api.ok("tenants.create", {"tenantId": "acme"})
    mixed = (await api.ok("pools.create", {"tenantId": "acme", "name": "mixed"}))["poolId"]
    h100 = await api.ok("pools.create", {"tenantId": "acme", "name": "h", "gpuModel": "H100"})
    await record_inventory(ledger, _of_model(make_inventory("a1", mixed, gpus=4), "A100"), 1)
    await record_inventory(ledger, _of_model(make_inventory("l1", mixed, gpus=2), "L40S"), 1)
    await record_inventory(ledger, make_inventory("h1", h100["poolId"], gpus=2), 1)

    def book(model: str, key: str, **extra: Any) -> dict[str, Any]:
        return {
            "tenantId": "acme", "poolId": mixed, "duration": "1h", "idempotencyKey": key,
            "devices": [{"class": "gpu", "count": 1, "selector": {"model": model}}],
        } | extra  # fmt: skip

    await api.ok("reservations.create", book("A100", "now"))
    later = 2**41  # 2039: well after now
    await api.ok("reservations.create", book("L40S", "later", start=later))

    summary = await api.ok("capacity.fleet", {})
    pools = {p["name"]: p for p in summary["pools"]}
    assert pools["mixed"]["gpuModels"] == {
        "A100": {"total": 4, "allocatable": 4, "allocated": 1, "reserved": 0, "available": 3},
        "L40S": {"total": 2, "allocatable": 2, "allocated": 0, "reserved": 1, "available": 1},
    }
    assert "gpuModels" not in pools["h"]
    other = summary["byGpuModel"]["other"]
    assert (other["total"], other["allocated"], other["reserved"]) == (6, 1, 1)
    # A tenant's summary (the hot read) keeps the seed's shape, stored rollup only.
    tenant = await api.ok("capacity.summary", {"tenantId": "acme"})
    assert all(p.get("gpuModels") is None for p in tenant["pools"]), tenant["pools"]
    assert tenant["byGpuModel"]["other"] == other
