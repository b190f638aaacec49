"""gpus.list (issue 34, point 3): every GPU unit of the fleet with node, pool, model,
state and holder, filtered and paged, from a bounded number of SQL statements whatever
the number of nodes (the CLI's `gpus`, `nodes` and `watch` used to ask `nodes.get` of
each node). Disclosure to tenants is in test_tenant_privacy.py."""

from __future__ import annotations

from typing import Any

import msgspec

from coordinator.services.node_records import record_inventory
from shared.wire import Inventory
from tests.database import statements
from tests.factories import make_inventory
from tests.integration.conftest import Served


def _model(inv: Inventory, model: str) -> Inventory:
    atoms = tuple(
        msgspec.structs.replace(a, attrs=dict(a.attrs) | {"model": model})
        if a.cls == "gpu" else a
        for a in inv.atoms
    )  # fmt: skip
    return msgspec.structs.replace(inv, atoms=atoms)


async def _fleet(s: Served, nodes: int = 3) -> dict[str, str]:
    """acme's pool `alpha` with `nodes` H100 nodes of 2 GPUs (rack=r1 on even ones) and
    one A100 node with 2 MIG instances; globex's pool `beta` with one node."""
    for tenant in ("acme", "globex"):
        await s.api.ok("tenants.create", {"tenantId": tenant})
    alpha = (await s.api.ok("pools.create", {"tenantId": "acme", "name": "alpha"}))["poolId"]
    beta = (await s.api.ok("pools.create", {"tenantId": "globex", "name": "beta"}))["poolId"]
    now = s.clock.now_ms()
    for i in range(nodes):
        labels = {"rack": "r1" if i % 2 == 0 else "r2", "gpu.count": "2"}
        await record_inventory(s.ledger, make_inventory(f"h{i:02}", alpha, gpus=2, labels=labels),
                               now)  # fmt: skip
    a100 = _model(make_inventory("a0", alpha, gpus=1, mig=2), "NVIDIA A100-SXM4-80GB")
    await record_inventory(s.ledger, a100, now)
    await record_inventory(s.ledger, make_inventory("b0", beta, gpus=2), now)
    return {"alpha": alpha, "beta": beta}


async def _all(s: Served, body: dict[str, Any], key: str | None = None) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    while True:
        page = await s.api.ok("gpus.list", body, key)
        found += page["gpus"]
        if not page["nextCursor"]:
            return found
        body = body | {"cursor": page["nextCursor"]}


def _ids(units: list[dict[str, Any]]) -> list[str]:
    return [u["atomId"] for u in units]


async def test_every_unit_once_by_node_then_atom_across_pages(served: Served) -> None:
    pools = await _fleet(served)
    whole = (await served.api.ok("gpus.list", {"limit": 1000}))["gpus"]
    # 3 nodes × 2 GPUs, the A100 node's GPU and 2 MIG instances, beta's 2 GPUs.
    assert len(whole) == 11
    assert [(u["nodeId"], u["atomId"]) for u in whole] == sorted(
        (u["nodeId"], u["atomId"]) for u in whole
    )
    assert _ids(await _all(served, {"limit": 3})) == _ids(whole)
    first = next(u for u in whole if u["atomId"] == "a0:gpu:GPU-a0-0")
    assert first["nodeId"] == "a0" and first["poolId"] == pools["alpha"]
    assert first["poolName"] == "alpha" and first["state"] == "free"
    assert first["model"] == "NVIDIA A100-SXM4-80GB" and first["heldBy"] is None
    # Each unit as nodes.get shows its atom.
    node = await served.api.ok("nodes.get", {"nodeId": "h01"})
    atoms = {a["atomId"]: a for a in node["atoms"]}
    for unit in (u for u in whole if u["nodeId"] == "h01"):
        extra = {k: unit[k] for k in ("nodeId", "poolId", "poolName", "model", "state")}
        assert unit == atoms[unit["atomId"]] | extra


async def test_filters_by_pool_node_label_model_and_state(served: Served) -> None:
    pools = await _fleet(served)
    beta = await _all(served, {"poolId": pools["beta"]})
    assert {u["nodeId"] for u in beta} == {"b0"}
    assert {u["nodeId"] for u in await _all(served, {"nodeId": "h01"})} == {"h01"}
    r1 = await _all(served, {"labels": {"rack": "r1", "gpu.count": "2"}, "limit": 1})
    assert {u["nodeId"] for u in r1} == {"h00", "h02"}
    assert await _all(served, {"labels": {"rack": "r1", "zone": "z"}}) == []
    a100 = await _all(served, {"model": ["a100"]})
    assert _ids(a100) == ["a0:gpu:GPU-a0-0"]  # the MIG instances report no model
    assert len(await _all(served, {"model": ["H100", "a100"]})) == 9

    await served.api.ok(
        "nodes.setMaintenance", {"nodeId": "h00", "maintenance": True, "reason": "cables"}
    )
    booked = await served.api.ok("reservations.create", {
        "tenantId": "acme", "poolId": pools["alpha"], "devices": [{"class": "gpu", "count": 1}],
        "start": served.clock.now_ms(), "duration": 3600, "idempotencyKey": "k1",
    })  # fmt: skip
    held = await _all(served, {"state": ["held"], "limit": 1})
    assert _ids(held) == [booked["atoms"][0]["atomId"]]
    assert held[0]["heldBy"]["reservationId"] == booked["reservationId"]
    maint = await _all(served, {"state": ["maintenance"], "limit": 1})
    assert {u["nodeId"] for u in maint} == {"h00"} and len(maint) == 2
    both = await _all(served, {"state": ["held", "maintenance"], "limit": 2})
    assert len(both) == 3
    free = await _all(served, {"state": ["free"], "poolId": pools["alpha"]})
    assert len(free) == 9 - 3


async def test_a_tenant_lists_the_pools_it_sees_and_others_holders_as_held(
    served: Served,
) -> None:
    pools = await _fleet(served)
    keys = {
        t: (await served.api.ok("apiKeys.create", {"tenantId": t}))["key"]
        for t in ("acme", "globex")
    }
    seen = await _all(served, {"tenantId": "globex"}, keys["globex"])
    assert {u["nodeId"] for u in seen} == {"b0"}
    code = await served.api.call(
        "gpus.list", {"tenantId": "globex", "poolId": pools["alpha"]}, keys["globex"]
    )
    assert code[0] == 404
    assert (await served.api.call("gpus.list", {}, keys["globex"]))[0] == 403  # whose?
    await served.api.ok(
        "pools.offer", {"tenantId": "acme", "poolId": pools["alpha"], "offerTo": "globex"}
    )
    await served.api.ok("reservations.create", {
        "tenantId": "acme", "poolId": pools["alpha"], "devices": [{"class": "gpu", "count": 1}],
        "start": served.clock.now_ms(), "duration": 3600, "idempotencyKey": "k1",
    }, keys["acme"])  # fmt: skip
    seen = await _all(served, {"tenantId": "globex", "state": ["held"]}, keys["globex"])
    assert [u["heldBy"] for u in seen] == [{"other": True}]
    mine = await _all(served, {"tenantId": "acme", "state": ["held"]}, keys["acme"])
    assert mine[0]["heldBy"]["tenantId"] == "acme"


async def test_a_bad_cursor_or_filter_is_refused(served: Served) -> None:
    await _fleet(served)
    for body in ({"cursor": "bm90LWEtY3Vyc29y"}, {"state": ["asleep"]}, {"limit": 0}):
        status, answer = await served.api.call("gpus.list", body)
        assert status == 400, (body, answer)


async def test_the_statements_a_page_costs_do_not_grow_with_nodes(served: Served) -> None:
    pools = await _fleet(served, nodes=2)
    with statements() as small:
        assert len((await served.api.ok("gpus.list", {"limit": 1000}))["gpus"]) == 9
    now = served.clock.now_ms()
    for i in range(2, 40):
        await record_inventory(served.ledger, make_inventory(f"h{i:02}", pools["alpha"], gpus=2),
                               now)  # fmt: skip
    with statements() as large:
        assert len((await served.api.ok("gpus.list", {"limit": 1000}))["gpus"]) == 85
    assert len(large) == len(small) <= 8, large
