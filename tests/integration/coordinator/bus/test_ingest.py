"""Heartbeats and inventories through a real nats-server into the ledger."""

from __future__ import annotations

import json

import nats
import pytest

from coordinator.app import Coordinator
from shared.subjects import Subjects
from shared.wire import Alert, DeviceHealth
from tests.factories import make_heartbeat, make_inventory
from tests.integration.conftest import Api
from tests.waiting import eventually


async def _pool(api: Api) -> str:
    await api.ok("tenants.create", {"tenantId": "acme"})
    pool = await api.ok("pools.create", {"tenantId": "acme", "name": "p", "gpuModel": "H100"})
    return str(pool["poolId"])


async def _gpu_row(api: Api, pool_id: str) -> dict[str, int]:
    rows = await api.ok("capacity.byPool", {"tenantId": "acme", "poolId": pool_id})
    return next(r for r in rows["rows"] if r["resource"] == "gpu")


@pytest.fixture
async def nc(coordinator: Coordinator):  # type: ignore[no-untyped-def]
    client = await nats.connect(coordinator.settings.nats.url)
    yield client
    await client.close()


async def test_inventory_and_heartbeats_reach_the_ledger_and_the_rollup(
    api: Api, coordinator: Coordinator, nc: nats.NATS
) -> None:
    pool = await _pool(api)
    s = Subjects(coordinator.settings.nats.subject_prefix)
    inv = make_inventory("gpu01.dc1", pool, gpus=8)
    await nc.publish(s.inventory(pool, inv.node_id), inv.to_json())
    await eventually(lambda: _has_total(api, pool, 8))
    for seq in range(3):
        await nc.publish(s.heartbeat(pool, inv.node_id), make_heartbeat(inv, seq).to_json())
    await nc.flush()
    await eventually(lambda: _accepted(coordinator, "hb", 3))


async def _has_total(api: Api, pool: str, total: int) -> bool:
    return (await _gpu_row(api, pool))["total"] == total


async def _accepted(coordinator: Coordinator, kind: str, n: int) -> bool:
    return coordinator.ingest.accepted[kind] >= n


async def test_bad_messages_are_dropped_by_reason_while_good_ones_flow(
    api: Api, coordinator: Coordinator, nc: nats.NATS
) -> None:
    pool = await _pool(api)
    s = Subjects(coordinator.settings.nats.subject_prefix)
    good = make_inventory("good", pool, gpus=2)
    foreign = make_inventory("other", pool, gpus=2)
    unknown_pool = make_inventory("lost", "pool_" + "z" * 26, gpus=2)
    garbage = [
        (s.heartbeat(pool, "good"), b"\xff not json"),
        (s.heartbeat(pool, "good"), json.dumps({"nodeId": "good"}).encode()),
        (s.heartbeat(pool, "good"), b"{" + b" " * 20_000 + b"}"),
        (s.inventory(pool, "good"), foreign.to_json()),
        (s.inventory(unknown_pool.pool_id, "lost"), unknown_pool.to_json()),
    ]
    for subject, payload in garbage:
        await nc.publish(subject, payload)
        await nc.publish(s.inventory(pool, "good"), good.to_json())
    await nc.publish(f"{s.prefix}.hb.{pool}.x.y", b"{}")
    await nc.flush()
    await eventually(lambda: _has_total(api, pool, 2))
    await eventually(lambda: _dropped_all(coordinator))
    assert coordinator.ingest.accepted["inv"] == len(garbage) + 1
    nodes = await coordinator.ledger.nodes.liveness_snapshot()
    assert [n.node_id for n in nodes] == ["good"]


async def _dropped_all(coordinator: Coordinator) -> bool:
    d = coordinator.ingest.dropped
    return all(
        d[r] >= 1
        for r in ("not_json", "bad_schema", "too_large", "subject_mismatch", "unknown_pool")
    )


async def test_device_fault_in_a_heartbeat_moves_atoms_records_an_event_and_alerts(
    api: Api, coordinator: Coordinator, nc: nats.NATS
) -> None:
    pool = await _pool(api)
    s = Subjects(coordinator.settings.nats.subject_prefix)
    alerts: list[Alert] = []

    async def on_alert(msg: nats.aio.msg.Msg) -> None:
        alerts.append(Alert.from_json(msg.data))

    await nc.subscribe(s.all_alerts, cb=on_alert)
    inv = make_inventory("n1", pool, gpus=4)
    await nc.publish(s.inventory(pool, "n1"), inv.to_json())
    await eventually(lambda: _has_total(api, pool, 4))
    sick = (DeviceHealth(device_id="GPU-n1-2", status="unhealthy", reasons=("xid 79",)),)
    await nc.publish(s.heartbeat(pool, "n1"), make_heartbeat(inv, 1, devices=sick).to_json())

    async def moved() -> bool:
        row = await _gpu_row(api, pool)
        return (row["allocatable"], row["unhealthy"]) == (3, 1)

    await eventually(moved)
    await eventually(lambda: _alerted(alerts, "device.unhealthy"))
    assert alerts[-1].device_id == "GPU-n1-2" and "xid 79" in alerts[-1].reason
    events = await coordinator.ledger.catalog.events("n1")
    assert [e.kind for e in events][-1] == "device.unhealthy"
    # Recovery: the next heartbeat without the device brings the atom back.
    await nc.publish(s.heartbeat(pool, "n1"), make_heartbeat(inv, 2).to_json())
    await eventually(lambda: _has_allocatable(api, pool, 4))
    await eventually(lambda: _alerted(alerts, "device.healthy"))


async def _has_allocatable(api: Api, pool: str, n: int) -> bool:
    return (await _gpu_row(api, pool))["allocatable"] == n


async def _alerted(alerts: list[Alert], kind: str) -> bool:
    return any(a.kind == kind for a in alerts)


async def test_a_silent_node_goes_unreachable_and_comes_back(
    api: Api, coordinator: Coordinator, nc: nats.NATS
) -> None:
    pool = await _pool(api)
    s = Subjects(coordinator.settings.nats.subject_prefix)
    inv = make_inventory("n1", pool, gpus=2)
    await nc.publish(s.inventory(pool, "n1"), inv.to_json())
    await eventually(lambda: _has_total(api, pool, 2))
    await nc.publish(s.heartbeat(pool, "n1"), make_heartbeat(inv, 1, interval_ms=200).to_json())
    await eventually(lambda: _accepted(coordinator, "hb", 1))
    # Registered after the coordinator started: no quiet window; 3 x 200 ms of silence.

    async def unreachable() -> bool:
        return (await _gpu_row(api, pool))["unreachable"] == 2

    await eventually(unreachable)
    events = [e.kind for e in await coordinator.ledger.catalog.events("n1")]
    assert "node.unreachable" in events
    # Back only once its heartbeats have held steady for the recovery hold (0.5 s here).
    seq = 2

    async def beat_until_back() -> bool:
        nonlocal seq
        seq += 1
        hb = make_heartbeat(inv, seq, interval_ms=200)
        await nc.publish(s.heartbeat(pool, "n1"), hb.to_json())
        return await _has_allocatable(api, pool, 2)

    await eventually(beat_until_back)
    assert seq > 4


async def test_an_inventory_claiming_gpus_it_lacks_is_refused_and_counted(
    api: Api, coordinator: Coordinator, nc: nats.NATS
) -> None:
    """The review's forgery, on the agent's own subject: no GPUs listed and 5,000 `gpu`
    atoms took a pool from 24 to 5,016 allocatable GPUs. It is refused whole, counted
    by reason, and the pool holds what the honest host has."""
    pool = await _pool(api)
    s = Subjects(coordinator.settings.nats.subject_prefix)
    honest = make_inventory("honest", pool, gpus=2)
    await nc.publish(s.inventory(pool, "honest"), honest.to_json())
    await eventually(lambda: _has_total(api, pool, 2))
    bare = make_inventory("forger", pool, gpus=0)
    forged_atoms = [
        {"atomId": f"forger:gpu:G{i}", "class": "gpu", "deviceId": f"G{i}"} for i in range(5000)
    ]
    body = json.loads(bare.to_json())
    body["atoms"] += forged_atoms
    await nc.publish(s.inventory(pool, "forger"), json.dumps(body).encode())
    await nc.flush()
    await eventually(lambda: _dropped(coordinator, "unbacked_atom"))
    assert (await _gpu_row(api, pool))["total"] == 2
    nodes = await coordinator.ledger.nodes.liveness_snapshot()
    assert [n.node_id for n in nodes] == ["honest"]


async def _dropped(coordinator: Coordinator, reason: str) -> bool:
    return coordinator.ingest.dropped[reason] >= 1
