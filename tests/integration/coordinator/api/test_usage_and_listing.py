"""usage.report, reservations.list filters, tenants.list, apiKeys.list/self, nodes.list
across pools and nodes.get holders, over HTTP on SQLite and PostgreSQL, with a clock the
test moves."""

from __future__ import annotations

from typing import Any

import pytest

from coordinator.app import Coordinator
from coordinator.services.node_records import record_inventory
from shared.clock import FakeClock
from tests.factories import make_inventory
from tests.integration.conftest import Api

T0 = 1_800_000_000_000
MIN = 60_000
PROJECT = "prj_01hzy3k4m5n6p7q8r9s0t1v2w3"


async def _fleet(api: Api, c: Coordinator) -> tuple[str, str]:
    await api.ok("tenants.create", {"tenantId": "acme"})
    await api.ok("tenants.create", {"tenantId": "globex"})
    pool = (await api.ok("pools.create", {"tenantId": "acme", "name": "p"}))["poolId"]
    other = (await api.ok("pools.create", {"tenantId": "globex", "name": "q"}))["poolId"]
    await record_inventory(c.ledger, make_inventory("n0", pool, gpus=8), 1)
    await record_inventory(c.ledger, make_inventory("m0", other, gpus=4), 1)
    return str(pool), str(other)


def _req(pool: str, key: str, count: int, duration: str, **extra: Any) -> dict[str, Any]:
    return {
        "tenantId": "acme", "poolId": pool, "devices": [{"class": "gpu", "count": count}],
        "duration": duration, "idempotencyKey": key,
    } | extra  # fmt: skip


async def test_usage_counts_what_ran_and_listing_filters_by_state(
    capi: Api, clocked: Coordinator, clock: FakeClock
) -> None:
    pool, _ = await _fleet(capi, clocked)
    early = await capi.ok("reservations.create", _req(pool, "a", 2, "2h"))
    spot = await capi.ok(
        "reservations.create", _req(pool, "b", 2, "4h", spot=True, projectId=PROJECT)
    )
    clock.advance(60 * MIN)
    await capi.ok(
        "reservations.release", {"tenantId": "acme", "reservationId": early["reservationId"]}
    )
    # Needs all 8 GPUs: the spot reservation is noticed, preempted 2 minutes on.
    big = await capi.ok("reservations.create", _req(pool, "c", 8, "1h"))
    assert big["start"] == T0 + 62 * MIN
    clock.advance(10 * MIN)

    report = await capi.ok(
        "usage.report", {"tenantId": "acme", "from": T0 - MIN, "to": T0 + 1440 * MIN}
    )
    # released after 1 h: 2 GPU-h; preempted at 62 min: 2 × 62/60; the big one 8 × 8/60.
    assert report["totals"]["gpu"] == pytest.approx(2 + 124 / 60 + 64 / 60, abs=1e-5)
    # Per project: the spot booking's own row, the other two under no project.
    rows = {r["projectId"]: r for r in report["rows"] if r["resource"] == "gpu"}
    assert (rows[None]["tenantId"], rows[None]["poolId"], rows[None]["reservations"]) == (
        "acme", pool, 2,
    )  # fmt: skip
    assert rows[PROJECT]["hours"] == pytest.approx(124 / 60, abs=1e-5)
    assert rows[PROJECT]["reservations"] == 1
    by_project = await capi.ok("usage.report", {
        "tenantId": "acme", "projectId": PROJECT, "from": T0 - MIN, "to": T0 + 1440 * MIN,
    })  # fmt: skip
    assert by_project["totals"] == {"gpu": pytest.approx(124 / 60, abs=1e-5)}
    assert report["asOf"] == T0 + 70 * MIN
    # Nothing ran before the window.
    empty = await capi.ok("usage.report", {"tenantId": "acme", "from": T0 - 60 * MIN, "to": T0})
    assert empty["rows"] == [] and empty["totals"] == {}

    async def listed(**filters: Any) -> list[str]:
        page = await capi.ok("reservations.list", {"tenantId": "acme"} | filters)
        return [r["reservationId"] for r in page["reservations"]]

    assert await listed(state=["released"]) == [early["reservationId"]]
    assert await listed(state=["preempted"]) == [spot["reservationId"]]
    assert await listed(projectId=PROJECT) == [spot["reservationId"]]
    assert await listed(state=["scheduled", "active", "noticed"]) == [big["reservationId"]]
    # Overlapping a window after the preemption: only what still runs then.
    assert await listed(poolId=pool, **{"from": T0 + 90 * MIN}) == [big["reservationId"]]
    assert await listed(**{"to": T0 + MIN}) == [spot["reservationId"], early["reservationId"]]
    status, err = await capi.call("reservations.list", {"tenantId": "acme", "state": ["gone"]})
    assert status == 400 and err["error"]["details"]["fields"][0]["path"].startswith("state")


async def test_operators_list_everything_and_tenants_only_their_own(
    capi: Api, clocked: Coordinator
) -> None:
    pool, other = await _fleet(capi, clocked)
    acme = (await capi.ok("apiKeys.create", {"tenantId": "acme", "label": "ci"}))["key"]
    booked = await capi.ok("reservations.create", _req(pool, "h", 1, "1h"))

    tenants = (await capi.ok("tenants.list", {}))["tenants"]
    assert {t["tenantId"]: t["pools"] for t in tenants} == {"acme": 1, "globex": 1, "operator": 0}
    keys = (await capi.ok("apiKeys.list", {"tenantId": "acme"}))["keys"]
    assert [k["label"] for k in keys] == ["ci"]
    assert set(keys[0]) == {"keyId", "tenantId", "roles", "label", "createdAt", "revokedAt"}
    assert await capi.ok("apiKeys.self", {}, key=acme) == {
        "keyId": acme.split("_")[1], "tenantId": "acme", "roles": ["tenant"], "operator": False,
    }  # fmt: skip
    status, err = await capi.call("tenants.list", {}, key=acme)
    assert (status, err["error"]["code"]) == (403, "PERMISSION_DENIED")

    # Leaving out tenantId: every tenant's for an operator, refused for a tenant.
    every = await capi.ok("nodes.list", {})
    assert [n["nodeId"] for n in every["nodes"]] == ["m0", "n0"]
    mine = await capi.ok("nodes.list", {"tenantId": "acme"}, key=acme)
    assert [n["nodeId"] for n in mine["nodes"]] == ["n0"]
    status, err = await capi.call("nodes.list", {}, key=acme)
    assert status == 403 and "tenantId is required" in err["error"]["message"]
    status, _ = await capi.call("nodes.list", {"tenantId": "acme", "poolId": other}, key=acme)
    assert status == 404
    everyone = await capi.ok("reservations.list", {})
    assert [r["tenantId"] for r in everyone["reservations"]] == ["acme"]
    # One reservation by its id alone: an operator's lookup; a tenant names itself.
    by_id = {"reservationId": booked["reservationId"]}
    assert (await capi.ok("reservations.get", by_id))["tenantId"] == "acme"
    status, err = await capi.call("reservations.get", by_id, key=acme)
    assert status == 403 and "tenantId is required" in err["error"]["message"]
    status, _ = await capi.call("reservations.get", by_id | {"tenantId": "globex"})
    assert status == 404

    node = await capi.ok("nodes.get", {"tenantId": "acme", "nodeId": "n0"}, key=acme)
    held = [a for a in node["atoms"] if a["heldBy"]]
    assert [a["heldBy"]["reservationId"] for a in held] == [booked["reservationId"]]
    assert {a["bucket"] for a in node["atoms"]} == {"allocatable"}


async def test_usage_counts_mig_vf_and_scalar_hours_by_resource(
    capi: Api, clocked: Coordinator, clock: FakeClock
) -> None:
    await capi.ok("tenants.create", {"tenantId": "acme"})
    pool = (await capi.ok("pools.create", {"tenantId": "acme", "name": "m"}))["poolId"]
    await record_inventory(clocked.ledger, make_inventory("k0", pool, gpus=0, mig=2, nics=2), 1)
    body = {
        "tenantId": "acme", "poolId": pool, "duration": "2h", "idempotencyKey": "mig",
        "devices": [{"class": "gpu.mig", "count": 2}, {"class": "nic.vf", "count": 1}],
        "resources": {"vcpu": 8},
    }  # fmt: skip
    await capi.ok("reservations.create", body)
    clock.advance(30 * MIN)
    report = await capi.ok("usage.report", {"tenantId": "acme", "from": T0, "to": T0 + 240 * MIN})
    # Half an hour so far: 2 MIG instances, 1 VF, 8 vCPU; nothing counted for what is to come.
    assert report["totals"] == pytest.approx({"gpu.mig": 1.0, "nic.vf": 0.5, "vcpu": 4.0})


async def test_listing_by_node_finds_what_maintenance_would_put_at_risk(
    capi: Api, clocked: Coordinator, clock: FakeClock
) -> None:
    """`nodeId`: the reservations booked on a node (`gpufleet maintenance --dry-run`),
    a tenant's own only; reading them changes nothing."""
    pool, _ = await _fleet(capi, clocked)
    await record_inventory(clocked.ledger, make_inventory("n1", pool, gpus=8), 1)
    on_n0 = await capi.ok("reservations.create", _req(pool, "n0", 8, "1h"))
    later = await capi.ok("reservations.create", _req(pool, "later", 8, "1h", start=T0 + 120 * MIN))
    on_n1 = await capi.ok("reservations.create", _req(pool, "n1", 2, "1h"))
    node_of = {r["reservationId"]: r["atoms"][0]["nodeId"] for r in (on_n0, later, on_n1)}
    n0 = [rid for rid, node in node_of.items() if node == "n0"]
    assert n0 and len(n0) < 3

    live = ["scheduled", "active", "noticed"]
    found = await capi.ok("reservations.list", {"nodeId": "n0", "state": live})
    assert sorted(r["reservationId"] for r in found["reservations"]) == sorted(n0)
    mine = await capi.ok("reservations.list", {"tenantId": "globex", "nodeId": "n0"})
    assert mine["reservations"] == []
    status, err = await capi.call("reservations.list", {"nodeId": "no such node!"})
    assert status == 400 and "nodeId" in str(err)
    # Ended: no longer live, still found without a state filter.
    clock.advance(61 * MIN)
    now_live = await capi.ok("reservations.list", {"nodeId": "n0", "state": live})
    assert [r["reservationId"] for r in now_live["reservations"]] == [
        rid for rid in n0 if rid == later["reservationId"]
    ]
    assert {r.get("atRisk") for r in found["reservations"]} == {None}
