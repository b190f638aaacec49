"""The Slurm bridge's view of the ledger, read from the real API over HTTP (SQLite and
PostgreSQL): live reservations only, with their nodes, whole-GPU counts and atom
classes; nodes with their maintenance flag and reason; every page followed. A ledger
or Slurm that cannot be read is a counted failure that changes nothing."""

from __future__ import annotations

import aiohttp

from coordinator.services.node_records import (
    record_heartbeat,
    record_inventory,
    record_reachability,
)
from ops.kit.client import ApiError
from ops.kit.embedded_nats import free_port
from ops.slurm.bridge.daemon import SlurmBridge
from ops.slurm.bridge.ledger_view import LedgerView
from ops.slurm.bridge.settings import BridgeSettings
from shared.wire import DeviceHealth
from tests.factories import make_heartbeat, make_inventory
from tests.integration.conftest import Served


async def _fleet(served: Served) -> str:
    api = served.api
    await api.ok("tenants.create", {"tenantId": "acme"})
    await api.ok("tenants.create", {"tenantId": "platform"})
    pool = (await api.ok("pools.create", {"tenantId": "acme", "name": "p"}))["poolId"]
    for node in ("n0", "n1"):
        inv = make_inventory(node, pool, gpus=8, nics=2, mig=2)
        await record_inventory(served.ledger, inv, served.clock.now_ms())
    return str(pool)


async def _observer_key(served: Served) -> str:
    """The bridge's key as docs/operator.md makes it: read-only, every tenant's."""
    body = {"tenantId": "platform", "roles": ["observer"], "label": "slurm-bridge"}
    return str((await served.api.ok("apiKeys.create", body))["key"])


async def _book(served: Served, pool: str, key: str, devices: list[dict[str, object]]) -> str:
    body = {
        "tenantId": "acme", "poolId": pool, "devices": devices, "duration": "1h",
        "idempotencyKey": key,
    }  # fmt: skip
    return str((await served.api.ok("reservations.create", body))["reservationId"])


async def test_the_ledger_as_the_bridge_reads_it(served: Served) -> None:
    pool = await _fleet(served)
    gpus = await _book(served, pool, "k1", [{"class": "gpu", "count": 3}])
    nics = await _book(served, pool, "k2", [{"class": "nic.vf", "count": 1}])
    gone = await _book(served, pool, "k3", [{"class": "gpu", "count": 1}])
    migs = await _book(served, pool, "k4", [{"class": "gpu.mig", "count": 2}])
    await served.api.ok("reservations.release", {"tenantId": "acme", "reservationId": gone})
    await served.api.ok(
        "nodes.setMaintenance", {"nodeId": "n1", "maintenance": True, "reason": "swap PSU"}
    )
    key = await _observer_key(served)
    async with aiohttp.ClientSession() as http:
        # One item a page: every cursor is followed.
        ledger = await LedgerView(http, served.api.base, key, page=1).read()
    by_id = {r.reservation_id: r for r in ledger.reservations}
    assert set(by_id) == {gpus, nics, migs}
    (mig_node,) = by_id[migs].nodes
    assert by_id[migs].mig == {mig_node: {"3g.40gb": 2}} and by_id[migs].gpus == {}
    booked = by_id[gpus]
    assert booked.tenant_id == "acme" and booked.pool_id == pool and booked.state == "active"
    assert sum(booked.gpus.values()) == 3 and booked.nodes == set(booked.gpus)
    assert booked.classes == {"gpu"} and by_id[nics].classes == {"nic.vf"}
    assert booked.end_ms - booked.start_ms == 3_600_000
    nodes = {n.node_id: n for n in ledger.nodes}
    assert set(nodes) == {"n0", "n1"}
    assert nodes["n1"].maintenance and nodes["n1"].maintenance_reason == "swap PSU"
    assert not nodes["n0"].maintenance
    assert nodes["n0"].unhealthy_gpus == ()


async def test_unhealthy_gpus_by_index_and_since_when_unreachable(served: Served) -> None:
    """A degraded node's unhealthy GPUs are read by index with their first reason (the
    drain reason names them); an unreachable node says since when (its grace period)."""
    pool = await _fleet(served)
    inv = make_inventory("n0", pool, gpus=8, nics=2, mig=2)
    xid = DeviceHealth(device_id="GPU-n0-3", status="unhealthy", reasons=("xid 79 off the bus",))
    hb = make_heartbeat(inv, 2, health="degraded", devices=(xid,))
    await record_heartbeat(served.ledger, hb, served.clock.now_ms())
    lost_at = served.clock.now_ms()
    await record_reachability(served.ledger, ["n1"], False, lost_at)
    async with aiohttp.ClientSession() as http:
        ledger = await LedgerView(http, served.api.base, served.api.operator_key).read()
    nodes = {n.node_id: n for n in ledger.nodes}
    assert nodes["n0"].health == "degraded"
    assert nodes["n0"].unhealthy_gpus == ("GPU3 xid 79 off the bus",)
    assert not nodes["n1"].reachable and nodes["n1"].reachable_since_ms == lost_at
    assert nodes["n0"].reachable


async def test_an_unreadable_ledger_or_slurm_is_a_counted_failure(served: Served) -> None:
    await _fleet(served)
    key = await _observer_key(served)
    bridge = SlurmBridge(BridgeSettings(coordinator_key="unused", scontrol="/nonexistent/scontrol"))

    def failures(kind: str) -> float | None:
        name = "gpufleet_slurm_bridge_failures_total"
        return bridge.metrics.registry.get_sample_value(name, {"kind": kind})

    async with aiohttp.ClientSession() as http:
        wrong_key = LedgerView(http, served.api.base, "gpf_not_a_key")
        try:
            await wrong_key.read()
        except ApiError as exc:
            assert exc.status == 401
        else:
            raise AssertionError("a wrong key read the ledger")
        assert await bridge.reconcile(wrong_key) is False
        refused = bridge.metrics.registry.get_sample_value(
            "gpufleet_slurm_bridge_refused_total", {"by": "coordinator"}
        )
        assert refused == 1 and failures("ledger.read") == 1
        dead = LedgerView(http, f"http://127.0.0.1:{free_port()}", key)
        assert await bridge.reconcile(dead) is False
        assert failures("ledger.read") == 2
        live = LedgerView(http, served.api.base, key)
        assert await bridge.reconcile(live) is False  # no scontrol: Slurm unread
        assert failures("slurm.read") == 1 and failures("ledger.read") == 2
    assert bridge.metrics.synced_at == 0.0
