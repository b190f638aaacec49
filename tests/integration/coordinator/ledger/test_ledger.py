"""The ledger on SQLite and PostgreSQL: migrations, inventories, transitions, rollup."""

from __future__ import annotations

import random

from coordinator.domain.model import RESOURCES
from coordinator.ledger import Ledger
from coordinator.services.node_records import (
    record_heartbeat,
    record_inventory,
    record_maintenance,
    record_reachability,
)
from shared.ids import new_pool_id
from shared.wire import DeviceHealth, Inventory
from tests.factories import make_heartbeat, make_inventory


async def _pools(ledger: Ledger, n: int = 2) -> list[str]:
    await ledger.tenants.create("acme", "Acme", 1)
    ids = [new_pool_id() for _ in range(n)]
    for i, pool_id in enumerate(ids):
        await ledger.pools.create(pool_id, f"p{i}", "acme", None, 1)
    return ids


async def _rows(ledger: Ledger, pool_id: str) -> dict[str, tuple[int, ...]]:
    return {r.resource: r.counts() for r in (await ledger.rollup([pool_id]))[pool_id]}


async def test_migrations_are_recorded_and_idempotent(ledger: Ledger) -> None:
    assert await ledger.migrate() == []


async def test_inventory_creates_atoms_and_a_changed_inventory_retires_missing_ones(
    ledger: Ledger,
) -> None:
    (pool,) = await _pools(ledger, 1)
    out = await record_inventory(ledger, make_inventory("n1", pool, gpus=8, nics=2), 10)
    assert out.transitions[0].kind == "node.registered"
    rows = await _rows(ledger, pool)
    assert rows["gpu"][0] == 8 and rows["nic.vf"][0] == 2 and rows["node"][0] == 1
    await record_inventory(ledger, make_inventory("n1", pool, gpus=6, nics=2), 20)
    assert (await _rows(ledger, pool))["gpu"][0] == 6
    assert await ledger.rebuild_all(30) == 0


async def test_provisioning_node_counts_as_provisioning_until_it_reports_ready(
    ledger: Ledger,
) -> None:
    (pool,) = await _pools(ledger, 1)
    inv = make_inventory("n1", pool, provisioning=True)
    await record_inventory(ledger, inv, 1)
    gpu = dict(zip(("total", "allocatable"), (await _rows(ledger, pool))["gpu"][:2], strict=True))
    assert gpu == {"total": 8, "allocatable": 0}
    rows = {r.resource: r for r in (await ledger.rollup([pool]))[pool]}
    assert rows["gpu"].provisioning == 8
    await record_heartbeat(ledger, make_heartbeat(inv), 2)
    rows = {r.resource: r for r in (await ledger.rollup([pool]))[pool]}
    assert (rows["gpu"].provisioning, rows["gpu"].allocatable) == (0, 8)


async def test_maintenance_is_an_event_with_reason_and_author_and_moves_the_node(
    ledger: Ledger,
) -> None:
    (pool,) = await _pools(ledger, 1)
    await record_inventory(ledger, make_inventory("n1", pool), 1)
    first = await record_maintenance(ledger, "n1", True, "swap PSU", "ops:alice", 5)
    assert (first.pool_id, [t.kind for t in first.transitions]) == (pool, ["node.maintenance"])
    again = await record_maintenance(ledger, "n1", True, "again", "ops:bob", 6)
    assert again.transitions == ()
    rows = {r.resource: r for r in (await ledger.rollup([pool]))[pool]}
    assert rows["gpu"].maintenance == 8 and rows["vcpu"].maintenance == 64
    event = (await ledger.catalog.events("n1"))[-1]
    assert (event.kind, event.reason, event.by, event.at) == (
        "node.maintenance",
        "swap PSU",
        "ops:alice",
        5,
    )


async def test_random_transitions_leave_no_drift_for_the_rebuild(ledger: Ledger) -> None:
    pools = await _pools(ledger, 2)
    rng = random.Random(1234)
    nodes = [f"n{i}" for i in range(6)]
    invs: dict[str, Inventory] = {}
    now = 100
    for _ in range(60):
        now += 1
        node = rng.choice(nodes)
        op = rng.choice(["inv", "health", "device", "reach", "maint"]) if node in invs else "inv"
        if op == "inv":
            invs[node] = make_inventory(
                node,
                rng.choice(pools),
                gpus=rng.randint(0, 8),
                mig=rng.randint(0, 3),
                nics=rng.randint(0, 2),
                provisioning=rng.random() < 0.2,
            )
            await record_inventory(ledger, invs[node], now)
        elif op == "health":
            status = rng.choice(["healthy", "degraded", "unhealthy", "unmonitored"])
            hb = make_heartbeat(invs[node], health=status, provisioning=rng.random() < 0.1)
            await record_heartbeat(ledger, hb, now)
        elif op == "device":
            dev = DeviceHealth(device_id=f"GPU-{node}-{rng.randint(0, 7)}", status="unhealthy")
            await record_heartbeat(ledger, make_heartbeat(invs[node], devices=(dev,)), now)
        elif op == "reach":
            await record_reachability(ledger, [node], rng.random() < 0.5, now)
        else:
            await record_maintenance(ledger, node, rng.random() < 0.5, "m", "op", now)
        for pool in pools:
            for resource, counts in (await _rows(ledger, pool)).items():
                total, _, _, _, _, *buckets = counts
                allocatable = counts[1]
                assert total == allocatable + sum(buckets), (resource, counts)
    before = {p: await _rows(ledger, p) for p in pools}
    assert await ledger.rebuild_all(now + 1) == 0
    assert {p: await _rows(ledger, p) for p in pools} == before
    assert all(set(rows) == set(RESOURCES) for rows in before.values())
