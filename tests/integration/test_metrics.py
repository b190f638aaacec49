"""/metrics: scraped and parsed as Prometheus does."""

from __future__ import annotations

import nats
from prometheus_client.parser import text_string_to_metric_families

from coordinator.app import Coordinator
from coordinator.services.node_changes import record_inventory
from shared.subjects import Subjects
from tests.factories import make_heartbeat, make_inventory
from tests.integration.conftest import Api
from tests.waiting import eventually

Samples = dict[str, dict[tuple[tuple[str, str], ...], float]]


async def scrape_text(api: Api) -> str:
    headers = {"Authorization": f"Bearer {api.operator_key}"}  # /metrics names tenants' pools
    async with api.session.get(f"{api.base}/metrics", headers=headers) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        return await resp.text()


async def _scrape(api: Api) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(await scrape_text(api)):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def _by(samples: dict[tuple[tuple[str, str], ...], float], **want: str) -> dict[str, float]:
    """Samples matching `want`, keyed by their remaining labels joined."""
    out = {}
    for labels, value in samples.items():
        d = dict(labels)
        if all(d.get(k) == v for k, v in want.items()):
            rest = ",".join(f"{k}={v}" for k, v in labels if k not in want)
            out[rest] = value
    return out


async def test_metrics_expose_ingest_drops_heartbeat_age_and_api_latency(
    api: Api, coordinator: Coordinator
) -> None:
    await api.ok("tenants.create", {"tenantId": "acme"})
    pool = (await api.ok("pools.create", {"tenantId": "acme", "name": "p"}))["poolId"]
    s = Subjects(coordinator.settings.subject_prefix)
    nc = await nats.connect(coordinator.settings.nats_url)
    try:
        inv = make_inventory("n1", pool, gpus=8)
        await nc.publish(s.inventory(pool, "n1"), inv.to_json())
        await nc.publish(s.heartbeat(pool, "n1"), b"not json")
        await nc.flush()

        async def registered() -> bool:
            return bool(await coordinator.ledger.nodes.liveness_snapshot())

        await eventually(registered)
        await nc.publish(s.heartbeat(pool, "n1"), make_heartbeat(inv).to_json())
        await nc.flush()

        async def counted() -> bool:
            return coordinator.ingest.accepted["hb"] >= 1

        await eventually(counted)
    finally:
        await nc.close()
    await api.ok("capacity.summary", {"tenantId": "acme"})
    await api.call("capacity.byPool", {"tenantId": "acme"})
    m = await _scrape(api)
    assert m["gpufleet_ingest_messages_total"][(("kind", "inv"),)] >= 1
    assert m["gpufleet_ingest_dropped_total"][(("reason", "not_json"),)] == 1
    # A histogram across nodes: one node, counted in +Inf and in every bucket above its age.
    assert m["gpufleet_heartbeat_age_seconds_bucket"][(("le", "+Inf"),)] == 1
    assert m["gpufleet_heartbeat_age_seconds_gcount"][()] == 1
    latency = m["gpufleet_api_request_duration_seconds_count"]
    assert latency[(("code", "200"), ("method", "capacity.summary"))] == 1
    assert latency[(("code", "400"), ("method", "capacity.byPool"))] == 1
    assert m["gpufleet_rollup_drift_corrections_total"][()] == 0
    assert m["gpufleet_alerts_published_total"][(("kind", "node.registered"),)] >= 1
    assert m["gpufleet_leader"][()] == 1
    assert m["gpufleet_nats_connected"][()] == 1


async def test_the_nats_errors_an_agent_reports_are_shown_for_its_node(
    api: Api, coordinator: Coordinator
) -> None:
    """An agent whose NATS user may not do all it tries says so in its heartbeats
    (`busErrors`); /metrics shows the latest count for each agent that reports any."""
    await api.ok("tenants.create", {"tenantId": "acme"})
    pool = (await api.ok("pools.create", {"tenantId": "acme", "name": "p"}))["poolId"]
    s = Subjects(coordinator.settings.subject_prefix)
    invs = [make_inventory(node, pool, gpus=1) for node in ("n1", "n2")]
    nc = await nats.connect(coordinator.settings.nats_url)
    try:
        for inv in invs:
            await nc.publish(s.inventory(pool, inv.node_id), inv.to_json())

        async def registered() -> bool:
            return len(await coordinator.ledger.nodes.liveness_snapshot()) == 2

        await eventually(registered)
        for seq, errors in ((1, 3), (2, 7)):
            hb = make_heartbeat(invs[0], seq).model_copy(update={"bus_errors": errors})
            await nc.publish(s.heartbeat(pool, "n1"), hb.to_json())
        await nc.publish(s.heartbeat(pool, "n2"), make_heartbeat(invs[1]).to_json())
        await nc.flush()

        async def heard() -> bool:
            return coordinator.ingest.accepted["hb"] >= 3

        await eventually(heard)
    finally:
        await nc.close()
    m = await _scrape(api)
    assert m["gpufleet_agent_bus_errors_total"] == {(("node", "n1"), ("pool", pool)): 7}


async def test_pool_series_are_parts_in_one_unit_and_gpus_join_with_dcgm_labels(
    capi: Api, clocked: Coordinator
) -> None:
    await capi.ok("tenants.create", {"tenantId": "acme"})
    await capi.ok("tenants.create", {"tenantId": "beta"})
    pool = (await capi.ok("pools.create", {"tenantId": "acme", "name": "train"}))["poolId"]
    await record_inventory(clocked.ledger, make_inventory("n1", pool, gpus=4, memory_gib=512), 1)
    booking = {"tenantId": "acme", "poolId": pool, "duration": "1h"}
    held = await capi.ok(
        "reservations.create",
        booking | {"devices": [{"class": "gpu", "count": 1}], "idempotencyKey": "a"},
    )
    status, _ = await capi.call(
        "reservations.create",
        booking | {"devices": [{"class": "gpu", "count": 9}], "idempotencyKey": "b"},
    )
    assert status == 409
    text = await scrape_text(capi)
    assert "_created" not in text
    m = await _scrape(capi)

    gpus = _by(m["gpufleet_pool_gpus"], pool=pool)
    assert gpus == {
        "state=allocated": 1, "state=available": 3, "state=maintenance": 0,
        "state=provisioning": 0, "state=reserved": 0, "state=unhealthy": 0,
        "state=unreachable": 0,
    }  # fmt: skip
    assert sum(_by(m["gpufleet_pool_memory_bytes"], pool=pool).values()) == 512 * 2**30
    assert "gpufleet_rollup" not in m
    info = m["gpufleet_pool_info"]
    key = (("gpu_model", ""), ("name", "train"), ("pool", pool), ("tenant", "acme"))
    assert info[key] == 1

    per_gpu = {dict(k)["UUID"]: dict(k) for k in m["gpufleet_gpu_info"]}
    assert set(per_gpu) == {f"GPU-n1-{i}" for i in range(4)}
    holders = [g for g in per_gpu.values() if g["reservation"]]
    assert len(holders) == 1
    assert holders[0]["reservation"] == held["reservationId"]
    assert (holders[0]["tenant"], holders[0]["state"], holders[0]["Hostname"]) == (
        "acme", "allocated", "n1",
    )  # fmt: skip
    assert {g["state"] for g in per_gpu.values() if not g["reservation"]} == {"available"}

    states = _by(m["gpufleet_node_state"], node="n1")
    assert states[f"pool={pool},state=ready"] == 1 and sum(states.values()) == 1

    assert m["gpufleet_bookings_total"][(("kind", "reservation"),)] == 1
    refusals = m["gpufleet_booking_refusals_total"]
    assert refusals[(("kind", "reservation"), ("reason", "capacity_not_available"))] == 1
    build = m["gpufleet_build_info"]
    assert len(build) == 1 and dict(next(iter(build)))["version"]
