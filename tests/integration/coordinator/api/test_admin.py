"""pools.*, nodes.*, quotas.set: tenant isolation, owner rules, maintenance; over HTTP to
the in-process app (alerts recorded; their way over NATS is test_alerts.py's)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import text

from coordinator.ledger import Ledger
from coordinator.services.node_records import record_inventory
from tests.database import database
from tests.factories import make_inventory
from tests.integration.conftest import Api, Served


async def _setup(api: Api, ledger: Ledger) -> dict[str, Any]:
    for tenant in ("acme", "globex"):
        await api.ok("tenants.create", {"tenantId": tenant})
    a = (await api.ok("pools.create", {"tenantId": "acme", "name": "a"}))["poolId"]
    b = (await api.ok("pools.create", {"tenantId": "globex", "name": "b"}))["poolId"]
    for i in range(3):
        await record_inventory(ledger, make_inventory(f"a{i}", a, gpus=2), 1)
    await record_inventory(ledger, make_inventory("b0", b, gpus=2), 1)
    keys = {t: (await api.ok("apiKeys.create", {"tenantId": t}))["key"] for t in ("acme", "globex")}
    return {"a": a, "b": b, "keys": keys}


async def _code(api: Api, method: str, body: dict[str, Any], key: str | None) -> str:
    status, payload = await api.call(method, body, key)
    return "OK" if status == 200 else payload["error"]["code"]


async def test_a_tenant_sees_another_tenants_pools_and_nodes_only_when_offered(
    served: Served,
) -> None:
    api = served.api
    s = await _setup(api, served.ledger)
    g = s["keys"]["globex"]
    reads = [
        ("pools.get", {"tenantId": "globex", "poolId": s["a"]}),
        ("pools.capacity", {"tenantId": "globex", "poolId": s["a"]}),
        ("nodes.list", {"tenantId": "globex", "poolId": s["a"]}),
        ("nodes.get", {"tenantId": "globex", "nodeId": "a0"}),
        ("nodes.events", {"tenantId": "globex", "nodeId": "a0"}),
    ]
    assert [await _code(api, m, b, g) for m, b in reads] == ["NOT_FOUND"] * 5
    listed = await api.ok("pools.list", {"tenantId": "globex"}, g)
    assert [p["poolId"] for p in listed["pools"]] == [s["b"]]

    offer = {"tenantId": "acme", "poolId": s["a"], "offerTo": "globex"}
    offered = await api.ok("pools.offer", offer, s["keys"]["acme"])
    assert offered["offeredTo"] == ["globex"]
    assert [await _code(api, m, b, g) for m, b in reads] == ["OK"] * 5
    seen = await api.ok("pools.get", {"tenantId": "globex", "poolId": s["a"]}, g)
    assert "offeredTo" not in seen  # only the owner learns who else has an offer
    # The one offered may use the pool but not re-offer or archive it.
    assert await _code(api, "pools.offer", offer | {"tenantId": "globex"}, g) == (
        "PERMISSION_DENIED"
    )
    assert await _code(api, "pools.archive", {"tenantId": "globex", "poolId": s["a"]}, g) == (
        "PERMISSION_DENIED"
    )

    await api.ok("pools.unoffer", offer, s["keys"]["acme"])
    assert [await _code(api, m, b, g) for m, b in reads] == ["NOT_FOUND"] * 5

    await api.ok("pools.offer", offer, s["keys"]["acme"])
    await api.ok("pools.archive", {"tenantId": "acme", "poolId": s["a"]}, s["keys"]["acme"])
    assert [await _code(api, m, b, g) for m, b in reads] == ["NOT_FOUND"] * 5
    owner = await api.ok("pools.get", {"tenantId": "acme", "poolId": s["a"]}, s["keys"]["acme"])
    assert owner["archived"] is True


async def test_nodes_list_pages_with_an_opaque_cursor(served: Served) -> None:
    api = served.api
    s = await _setup(api, served.ledger)
    key = s["keys"]["acme"]
    first = await api.ok("nodes.list", {"tenantId": "acme", "poolId": s["a"], "limit": 2}, key)
    assert [n["nodeId"] for n in first["nodes"]] == ["a0", "a1"]
    assert first["nodes"][0]["atoms"] == {"gpu": 2, "node": 1}
    assert first["nodes"][0]["status"] == "ready"
    rest = await api.ok(
        "nodes.list",
        {"tenantId": "acme", "poolId": s["a"], "limit": 2, "cursor": first["nextCursor"]},
        key,
    )
    assert [n["nodeId"] for n in rest["nodes"]] == ["a2"] and rest["nextCursor"] is None
    status, err = await api.call(
        "nodes.list", {"tenantId": "acme", "poolId": s["a"], "cursor": "%%%"}, key
    )
    assert (status, err["error"]["code"]) == (400, "INVALID_INPUT")


async def test_maintenance_moves_the_node_records_who_and_why_and_alerts(
    served: Served,
) -> None:
    api = served.api
    s = await _setup(api, served.ledger)
    assert await _code(
        api, "nodes.setMaintenance", {"nodeId": "a1", "maintenance": True, "reason": "x"},
        s["keys"]["acme"],
    ) == "PERMISSION_DENIED"  # fmt: skip
    node = await api.ok(
        "nodes.setMaintenance",
        {"nodeId": "a1", "maintenance": True, "reason": "replace PSU"},
    )
    assert node["status"] == "maintenance" and node["changed"] is True
    assert node["reason"] == "replace PSU" and node["reservationsAtRisk"] == 0
    rows = await api.ok("capacity.byPool", {"tenantId": "acme", "poolId": s["a"]})
    gpu = next(r for r in rows["rows"] if r["resource"] == "gpu")
    assert (gpu["maintenance"], gpu["allocatable"]) == (2, 4)
    events = await api.ok("nodes.events", {"tenantId": "acme", "nodeId": "a1"})
    last = events["events"][-1]
    assert (last["kind"], last["reason"]) == ("node.maintenance", "replace PSU")
    assert last["by"].startswith("operator/")
    assert [(a.kind, a.node_id) for a in served.alerts.alerts] == [("node.maintenance", "a1")]
    await api.ok("nodes.setMaintenance", {"nodeId": "a1", "maintenance": False})
    rows = await api.ok("capacity.byPool", {"tenantId": "acme", "poolId": s["a"]})
    assert next(r for r in rows["rows"] if r["resource"] == "gpu")["allocatable"] == 6
    assert await _code(
        api, "nodes.setMaintenance", {"nodeId": "nope", "maintenance": False}, None
    ) == "NOT_FOUND"  # fmt: skip


async def test_node_events_page_past_the_32_bit_ids(served: Served) -> None:
    """A ledger whose event ids went past 2^31 (a busy fleet over years) keeps recording
    and paging them; PostgreSQL once answered `after` = 2^31 with a 500."""
    api = served.api
    await _setup(api, served.ledger)
    big = 2**31
    events = await api.ok("nodes.events", {"tenantId": "acme", "nodeId": "a1", "after": big})
    assert events["events"] == []
    # One event stored at 2^31 + 6 and the id generator moved past it, as years would.
    async with database(served.database_url) as db, db.transaction() as conn:
        await conn.execute(
            text(
                "INSERT INTO node_events (event_id, node_id, pool_id, kind, reason, by, at)"
                " SELECT :id, node_id, pool_id, 'node.healthy', '', 'coordinator', 2"
                " FROM nodes WHERE node_id = 'a1'"
            ),
            {"id": big + 6},
        )
        if db.dialect == "postgresql":
            await conn.execute(
                text("SELECT setval(pg_get_serial_sequence('node_events', 'event_id'), :id)"),
                {"id": big + 6},
            )
    await api.ok("nodes.setMaintenance", {"nodeId": "a1", "maintenance": True, "reason": "x"})
    events = await api.ok("nodes.events", {"tenantId": "acme", "nodeId": "a1", "after": big})
    assert [(e["eventId"], e["kind"]) for e in events["events"]] == [
        (big + 6, "node.healthy"),
        (big + 7, "node.maintenance"),
    ]
    events = await api.ok("nodes.events", {"tenantId": "acme", "nodeId": "a1", "after": big + 6})
    assert [e["eventId"] for e in events["events"]] == [big + 7]


async def test_quotas_are_kept(served: Served) -> None:
    api = served.api
    s = await _setup(api, served.ledger)
    out = await api.ok("quotas.set", {"tenantId": "acme", "resource": "gpu", "limit": 16})
    out = await api.ok(
        "quotas.set", {"tenantId": "acme", "poolId": s["a"], "resource": "gpu", "limit": 8}
    )
    assert out["quotas"] == [
        {"poolId": None, "resource": "gpu", "limit": 16},
        {"poolId": s["a"], "resource": "gpu", "limit": 8},
    ]
