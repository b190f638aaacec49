"""Truth under change over HTTP (SPEC §5): `nodes.setMaintenance` answers briefly with
the number of reservations it put at risk, every reservation answer carries `atRisk`,
and `capacity.preview` says how many nodes the placer turned away and why."""

from __future__ import annotations

from typing import Any

from coordinator.app import Coordinator
from coordinator.services.node_records import record_inventory
from tests.factories import make_inventory
from tests.integration.conftest import Api


async def _pool(api: Api, c: Coordinator, nodes: int = 2) -> str:
    await api.ok("tenants.create", {"tenantId": "acme"})
    pool = (await api.ok("pools.create", {"tenantId": "acme", "name": "p"}))["poolId"]
    for i in range(nodes):
        await record_inventory(c.ledger, make_inventory(f"n{i}", pool, gpus=8), 1)
    return str(pool)


def req(pool: str, key: str, count: int = 1, **extra: Any) -> dict[str, Any]:
    return {
        "tenantId": "acme",
        "poolId": pool,
        "devices": [{"class": "gpu", "count": count}],
        "duration": "1h",
        "idempotencyKey": key,
    } | extra


async def test_maintenance_answers_briefly_and_reservations_say_they_are_at_risk(
    capi: Api, clocked: Coordinator
) -> None:
    pool = await _pool(capi, clocked, nodes=1)
    rids = [(await capi.ok("reservations.create", req(pool, f"k{i}", 2)))["reservationId"]
            for i in range(2)]  # fmt: skip
    out = await capi.ok(
        "nodes.setMaintenance", {"nodeId": "n0", "maintenance": True, "reason": "swap PSU"}
    )
    assert out == {
        "nodeId": "n0",
        "poolId": pool,
        "status": "maintenance",
        "maintenance": True,
        "reason": "swap PSU",
        "changed": True,
        "reservationsAtRisk": 2,
    }
    got = await capi.ok("reservations.get", {"tenantId": "acme", "reservationId": rids[0]})
    assert got["state"] == "active"
    assert got["atRisk"]["reason"] == "maintenance" and len(got["atRisk"]["atoms"]) == 2
    listed = await capi.ok("reservations.list", {"tenantId": "acme", "poolId": pool})
    assert all("atRisk" in r for r in listed["reservations"])
    back = await capi.ok("nodes.setMaintenance", {"nodeId": "n0", "maintenance": False})
    assert back["reservationsAtRisk"] == 0 and back["status"] == "ready"
    got = await capi.ok("reservations.get", {"tenantId": "acme", "reservationId": rids[0]})
    assert "atRisk" not in got


async def test_preview_counts_the_nodes_it_turned_away_by_reason(
    capi: Api, clocked: Coordinator
) -> None:
    pool = await _pool(capi, clocked, nodes=3)
    await capi.ok("nodes.setMaintenance", {"nodeId": "n0", "maintenance": True, "reason": "x"})
    await capi.ok("reservations.create", req(pool, "six", 6))
    await capi.ok("reservations.create", req(pool, "six-more", 6))
    out = await capi.ok("capacity.preview", req(pool, "p", 8))
    assert out["fits"] is False
    # n0 in maintenance; n1 and n2 hold six booked GPUs each.
    assert out["filtered"] == {"not allocatable: maintenance": 1, "too few free matching gpu": 2}
