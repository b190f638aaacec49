"""projects.create/list over HTTP on SQLite and PostgreSQL: a tenant issues its own
project ids (`prj_` + ULID) with names unique within it, sees only its own, and books
and lists reservations under them."""

from __future__ import annotations

import re

from coordinator.app import Coordinator
from coordinator.services.node_records import record_inventory
from tests.factories import make_inventory
from tests.integration.conftest import Api


async def test_a_tenant_issues_lists_and_books_under_its_projects(
    api: Api, coordinator: Coordinator
) -> None:
    for tenant in ("acme", "globex"):
        await api.ok("tenants.create", {"tenantId": tenant})
    acme = (await api.ok("apiKeys.create", {"tenantId": "acme"}))["key"]
    globex = (await api.ok("apiKeys.create", {"tenantId": "globex"}))["key"]

    made = await api.ok("projects.create", {"tenantId": "acme", "name": "llm"}, key=acme)
    assert re.fullmatch(r"prj_[0-9a-hjkmnp-tv-z]{26}", made["projectId"]), made
    assert (made["tenantId"], made["name"]) == ("acme", "llm") and made["createdAt"] > 0
    # An operator creates for any tenant; another tenant may use the same name.
    await api.ok("projects.create", {"tenantId": "acme", "name": "vision"})
    theirs = await api.ok("projects.create", {"tenantId": "globex", "name": "llm"}, key=globex)

    # Bad input and others' tenants: refused, nothing written.
    status, err = await api.call("projects.create", {"tenantId": "acme", "name": "llm"}, key=acme)
    assert (status, err["error"]["code"]) == (409, "ALREADY_EXISTS"), err
    for name in ("prj_01hzy3k4m5n6p7q8r9s0t1v2w3", "has space", "", "x" * 129):
        status, err = await api.call("projects.create", {"tenantId": "acme", "name": name})
        assert status == 400 and "name" in str(err), (name, err)
    status, _ = await api.call("projects.create", {"tenantId": "globex", "name": "x"}, key=acme)
    assert status == 403

    mine = (await api.ok("projects.list", {"tenantId": "acme"}, key=acme))["projects"]
    assert [p["name"] for p in mine] == ["llm", "vision"]
    status, _ = await api.call("projects.list", {}, key=acme)
    assert status == 403  # a tenant names itself
    every = (await api.ok("projects.list", {}))["projects"]
    assert [(p["tenantId"], p["name"]) for p in every] == [
        ("acme", "llm"), ("acme", "vision"), ("globex", "llm"),
    ]  # fmt: skip
    assert theirs["projectId"] not in {p["projectId"] for p in mine}

    pool = (await api.ok("pools.create", {"tenantId": "acme", "name": "p"}))["poolId"]
    await record_inventory(coordinator.ledger, make_inventory("n0", pool, gpus=2), 1)
    booked = await api.ok("reservations.create", {
        "tenantId": "acme", "poolId": pool, "projectId": made["projectId"],
        "devices": [{"class": "gpu", "count": 1}], "duration": "1h", "idempotencyKey": "p1",
    }, key=acme)  # fmt: skip
    listed = await api.ok("reservations.list", {"tenantId": "acme", "projectId": made["projectId"]})
    assert [r["reservationId"] for r in listed["reservations"]] == [booked["reservationId"]]
