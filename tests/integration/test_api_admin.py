"""pools.*, nodes.*, quotas.set: tenant isolation, owner rules, maintenance."""

from __future__ import annotations

from typing import Any

import nats

from coordinator.app import Coordinator
from coordinator.services.node_changes import record_inventory
from shared.subjects import Subjects
from shared.wire import Alert
from tests.factories import make_inventory
from tests.integration.conftest import Api
from tests.waiting import eventually


async def _setup(api: Api, coordinator: Coordinator) -> dict[str, Any]:
    for tenant in ("acme", "globex"):
        await api.ok("tenants.create", {"tenantId": tenant})
    a = (await api.ok("pools.create", {"tenantId": "acme", "name": "a"}))["poolId"]
    b = (await api.ok("pools.create", {"tenantId": "globex", "name": "b"}))["poolId"]
    for i in range(3):
        await record_inventory(coordinator.ledger, make_inventory(f"a{i}", a, gpus=2), 1)
    await record_inventory(coordinator.ledger, make_inventory("b0", b, gpus=2), 1)
    keys = {t: (await api.ok("apiKeys.create", {"tenantId": t}))["key"] for t in ("acme", "globex")}
    return {"a": a, "b": b, "keys": keys}


async def _code(api: Api, method: str, body: dict[str, Any], key: str) -> str:
    status, payload = await api.call(method, body, key)
    return "OK" if status == 200 else payload["error"]["code"]


async def test_a_tenant_sees_another_tenants_pools_and_nodes_only_when_offered(
    api: Api, coordinator: Coordinator
) -> None:
    s = await _setup(api, coordinator)
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


async def test_nodes_list_pages_with_an_opaque_cursor(api: Api, coordinator: Coordinator) -> None:
    s = await _setup(api, coordinator)
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
    api: Api, coordinator: Coordinator
) -> None:
    s = await _setup(api, coordinator)
    subjects = Subjects(coordinator.settings.subject_prefix)
    nc = await nats.connect(coordinator.settings.nats_url)
    alerts: list[Alert] = []

    async def on_alert(msg: Any) -> None:
        alerts.append(Alert.model_validate_json(msg.data))

    try:
        await nc.subscribe(subjects.all_alerts, cb=on_alert)
        assert await _code(
            api, "nodes.setMaintenance", {"nodeId": "a1", "maintenance": True, "reason": "x"},
            s["keys"]["acme"],
        ) == "PERMISSION_DENIED"  # fmt: skip
        status, err = await api.call("nodes.setMaintenance", {"nodeId": "a1", "maintenance": True})
        assert status == 400 and err["error"]["code"] == "INVALID_INPUT"
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

        async def alerted() -> bool:
            return any(a.kind == "node.maintenance" and a.node_id == "a1" for a in alerts)

        await eventually(alerted)
        await api.ok("nodes.setMaintenance", {"nodeId": "a1", "maintenance": False})
        rows = await api.ok("capacity.byPool", {"tenantId": "acme", "poolId": s["a"]})
        assert next(r for r in rows["rows"] if r["resource"] == "gpu")["allocatable"] == 6
        assert await _code(
            api, "nodes.setMaintenance", {"nodeId": "nope", "maintenance": False}, None
        ) == "NOT_FOUND"  # fmt: skip
    finally:
        await nc.close()


async def test_quotas_are_validated_and_kept(api: Api, coordinator: Coordinator) -> None:
    s = await _setup(api, coordinator)
    status, err = await api.call("quotas.set", {"tenantId": "acme", "resource": "gpus", "limit": 4})
    assert status == 400 and err["error"]["details"]["fields"][0]["path"] == "resource"
    status, err = await api.call("quotas.set", {"tenantId": "acme", "resource": "gpu", "limit": -1})
    assert status == 400
    out = await api.ok("quotas.set", {"tenantId": "acme", "resource": "gpu", "limit": 16})
    out = await api.ok(
        "quotas.set", {"tenantId": "acme", "poolId": s["a"], "resource": "gpu", "limit": 8}
    )
    assert out["quotas"] == [
        {"poolId": None, "resource": "gpu", "limit": 16},
        {"poolId": s["a"], "resource": "gpu", "limit": 8},
    ]
