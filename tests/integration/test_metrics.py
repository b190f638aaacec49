"""/metrics: scraped and parsed as Prometheus does."""

from __future__ import annotations

import nats
from prometheus_client.parser import text_string_to_metric_families

from coordinator.app import Coordinator
from shared.subjects import Subjects
from tests.factories import make_heartbeat, make_inventory
from tests.integration.conftest import Api
from tests.waiting import eventually


async def _scrape(api: Api) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    headers = {"Authorization": f"Bearer {api.operator_key}"}  # /metrics names tenants' pools
    async with api.session.get(f"{api.base}/metrics", headers=headers) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = await resp.text()
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


async def test_metrics_expose_rollup_ingest_drops_heartbeat_age_and_api_latency(
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
    rollup = m["gpufleet_rollup"]
    assert rollup[(("bucket", "total"), ("pool", pool), ("resource", "gpu"))] == 8
    assert rollup[(("bucket", "allocatable"), ("pool", pool), ("resource", "gpu"))] == 8
    assert rollup[(("bucket", "unreachable"), ("pool", pool), ("resource", "node"))] == 0
    assert m["gpufleet_ingest_messages_total"][(("kind", "inv"),)] >= 1
    assert m["gpufleet_ingest_dropped_total"][(("reason", "not_json"),)] == 1
    assert (("quantile", "1.0"),) in m["gpufleet_heartbeat_age_seconds"]
    latency = m["gpufleet_api_request_duration_seconds_count"]
    assert latency[(("code", "200"), ("method", "capacity.summary"))] == 1
    assert latency[(("code", "400"), ("method", "capacity.byPool"))] == 1
    assert m["gpufleet_rollup_drift_corrections_total"][()] == 0
