"""Restart safety: kill -9 the coordinator, start it on the same database, lose nothing."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ops.kit.client import ApiClient, ApiError
from ops.kit.embedded_nats import EmbeddedNats
from tests.e2e.fleet_procs import Fleet, stop, wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    with EmbeddedNats(store_dir=str(tmp_path / "js")) as nats_server:
        f = Fleet(tmp_path, nats_server.url)
        try:
            yield f
        finally:
            f.close()


def _picture(f: Fleet, pool: str, key: str) -> dict[str, Any]:
    op = f.operator()
    nodes = op.call("nodes.list", {"tenantId": "acme", "poolId": pool})["nodes"]
    return {
        "pools": op.call("pools.list", {"tenantId": "acme"})["pools"],
        "nodes": [(n["nodeId"], n["status"], n["atoms"]) for n in nodes],
        "events": {
            n["nodeId"]: op.call("nodes.events", {"tenantId": "acme", "nodeId": n["nodeId"]})[
                "events"
            ]
            for n in nodes
        },
        "rows": [
            {k: v for k, v in r.items() if k != "updatedAt"}
            for r in op.call("capacity.byPool", {"tenantId": "acme", "poolId": pool})["rows"]
        ],
        "tenant_key_works": bool(
            ApiClient(f.url, key).call("capacity.summary", {"tenantId": "acme"})
        ),
    }


def test_kill_9_and_restart_on_the_same_database_loses_nothing(fleet: Fleet) -> None:
    f = fleet
    f.start_coordinator()
    op = f.operator()
    op.call("tenants.create", {"tenantId": "acme"})
    op.call("tenants.create", {"tenantId": "globex"})
    pool = op.call("pools.create", {"tenantId": "acme", "name": "p", "gpuModel": "H100"})["poolId"]
    op.call("pools.offer", {"tenantId": "acme", "poolId": pool, "offerTo": "globex"})
    key = op.call("apiKeys.create", {"tenantId": "acme"})["key"]
    revoked = op.call("apiKeys.create", {"tenantId": "acme"})
    op.call("apiKeys.revoke", {"keyId": revoked["keyId"]})
    for name, profile in (("h1", "h100-sxm-8"), ("m1", "a100-mig-8")):
        f.start_agent(name, pool, profile, 1.0)

    def both_ready() -> bool:
        nodes = op.call("nodes.list", {"tenantId": "acme", "poolId": pool})["nodes"]
        return len(nodes) == 2 and all(n["status"] == "ready" for n in nodes)

    wait_for(both_ready, what="two nodes ready")
    op.call("nodes.setMaintenance", {"nodeId": "h1", "maintenance": True, "reason": "fans"})
    before = _picture(f, pool, key)

    assert f.coordinator is not None
    stop(f.coordinator, signal.SIGKILL)
    f.start_coordinator()
    after = _picture(f, pool, key)
    assert after == before
    with pytest.raises(ApiError) as err:
        ApiClient(f.url, revoked["key"]).call("capacity.summary", {"tenantId": "acme"})
    assert err.value.code == "UNAUTHENTICATED"
