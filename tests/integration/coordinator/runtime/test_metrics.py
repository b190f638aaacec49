"""/metrics: scraped and parsed as Prometheus does."""

from __future__ import annotations

from contextlib import AsyncExitStack
from datetime import UTC, datetime

import aiohttp
import msgspec
import nats
import pytest
from prometheus_client.parser import text_string_to_metric_families

from coordinator.app import Coordinator, running_coordinator
from coordinator.domain.consumption import MemoryAccrued, MemoryKey
from coordinator.domain.intervals import INTERVAL_MS
from coordinator.services.node_records import record_inventory
from procs.build import revision
from shared.clock import FakeClock
from shared.subjects import Subjects
from tests.factories import make_heartbeat, make_inventory
from tests.integration.conftest import Api, coordinator_settings
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
    s = Subjects(coordinator.settings.nats.subject_prefix)
    nc = await nats.connect(coordinator.settings.nats.url)
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
    s = Subjects(coordinator.settings.nats.subject_prefix)
    invs = [make_inventory(node, pool, gpus=1) for node in ("n1", "n2")]
    nc = await nats.connect(coordinator.settings.nats.url)
    try:
        for inv in invs:
            await nc.publish(s.inventory(pool, inv.node_id), inv.to_json())

        async def registered() -> bool:
            return len(await coordinator.ledger.nodes.liveness_snapshot()) == 2

        await eventually(registered)
        for seq, errors in ((1, 3), (2, 7)):
            hb = msgspec.structs.replace(make_heartbeat(invs[0], seq), bus_errors=errors)
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
    # The git revision this build is from (issue 34), read without running git.
    assert dict(next(iter(build)))["revision"] == revision() != ""


async def test_the_last_interval_splits_commitments_into_used_unused_and_on_demand(
    capi: Api, clocked: Coordinator, clock: FakeClock
) -> None:
    """Chargeback on the dashboard (issue 35): acme reserves 16 GB of a quarter and uses
    12 (4 unused), beta has no commitment and uses 3, and 2 GB are nobody's: the quarter
    after, the gauges say so in bytes, and used + unused is what was reserved."""
    for tenant in ("acme", "beta"):
        await capi.ok("tenants.create", {"tenantId": tenant})
    pool = (await capi.ok("pools.create", {"tenantId": "acme", "name": "train"}))["poolId"]
    await capi.ok("pools.offer", {"tenantId": "acme", "poolId": pool, "offerTo": "beta"})
    await record_inventory(clocked.ledger, make_inventory("n1", pool, gpus=4, memory_gib=512), 1)
    q = clock.now_ms() // INTERVAL_MS * INTERVAL_MS + 4 * INTERVAL_MS  # 30 min ahead at least
    at = lambda ms: datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")  # noqa: E731
    key = (await capi.ok("apiKeys.create", {"tenantId": "acme"}))["key"]
    body = {"poolId": pool, "intervals": [
        {"startsAt": at(q), "endsAt": at(q + INTERVAL_MS), "capacityGb": 16}]}  # fmt: skip
    async with capi.session.post(
        f"{capi.base}/api/capacity/reservations", json=body, headers={"X-API-Key": key}
    ) as resp:
        assert resp.status == 200, await resp.text()
    gib_q = 1024 * INTERVAL_MS
    await clocked.ledger.gpu_use.record(
        {}, [], [],
        memory={
            MemoryKey(q, "acme", pool): MemoryAccrued(12 * gib_q, 12 * 1024),
            MemoryKey(q, "beta", pool): MemoryAccrued(3 * gib_q, 3 * 1024),
            MemoryKey(q, "", pool): MemoryAccrued(2 * gib_q, 2 * 1024),
        },
    )  # fmt: skip
    before = await _scrape(capi)
    assert not before.get("gpufleet_memory_commitment_bytes")  # that quarter is not over
    clock.advance(q + INTERVAL_MS + 1 - clock.now_ms())
    m = await _scrape(capi)
    assert _by(m["gpufleet_memory_commitment_bytes"], pool=pool) == {
        "state=used,tenant=acme": 12 * 2**30, "state=unused,tenant=acme": 4 * 2**30,
    }  # fmt: skip
    assert _by(m["gpufleet_memory_on_demand_bytes"], pool=pool) == {
        "tenant=beta": 3 * 2**30, "tenant=": 2 * 2**30,
    }  # fmt: skip


# What the fleet is, the same whichever replica reads it: the leader's to export alone.
FLEET_SERIES = {
    "gpufleet_pool_info", "gpufleet_pool_gpus", "gpufleet_pool_nodes", "gpufleet_pool_vcpus",
    "gpufleet_pool_memory_bytes", "gpufleet_node_info", "gpufleet_node_state",
    "gpufleet_gpu_info", "gpufleet_heartbeat_age_seconds_bucket",
    "gpufleet_heartbeat_age_seconds_gcount", "gpufleet_alert_outbox_backlog",
    "gpufleet_alert_outbox_oldest_age_seconds",
}  # fmt: skip
# What this process did or is: every replica's own.
PROCESS_SERIES = {
    "gpufleet_build_info", "gpufleet_leader", "gpufleet_nats_connected",
    "gpufleet_nats_probe_failures_total", "gpufleet_bookings_total",
    "gpufleet_api_request_duration_seconds_count", "gpufleet_alerts_published_total",
    "gpufleet_rollup_drift_corrections_total", "gpufleet_leader_fenced_writes_total",
}  # fmt: skip


@pytest.mark.timeout(240)  # a failover on a loaded machine
async def test_only_the_leader_exports_the_fleet_and_a_new_leader_takes_it_over(
    database_url: str, nats_url: str
) -> None:
    """Two replicas scraped together add up to one fleet: `sum` is not doubled and the
    DCGM join finds one `gpufleet_gpu_info` per GPU."""
    if not database_url.startswith("postgresql"):
        pytest.skip("replicas share a PostgreSQL ledger")
    settings = coordinator_settings(database_url, nats_url)
    async with AsyncExitStack() as outer:
        leader_stack = AsyncExitStack()
        a = await leader_stack.enter_async_context(running_coordinator(settings))
        b = await outer.enter_async_context(running_coordinator(settings))
        outer.push_async_callback(leader_stack.aclose)
        assert [a.leadership.is_leader, b.leadership.is_leader] == [True, False]
        session = await outer.enter_async_context(aiohttp.ClientSession())
        key = settings.bootstrap_operator_key
        assert key
        api_a, api_b = Api(session, a.url, key), Api(session, b.url, key)
        await api_b.ok("tenants.create", {"tenantId": "acme"})
        pool = (await api_b.ok("pools.create", {"tenantId": "acme", "name": "p"}))["poolId"]
        await record_inventory(a.ledger, make_inventory("n1", pool, gpus=4), 1)
        await api_a.ok("capacity.summary", {"tenantId": "acme"})

        leader, follower = await _scrape(api_a), await _scrape(api_b)
        assert FLEET_SERIES | PROCESS_SERIES <= set(leader)
        assert sum(_by(leader["gpufleet_pool_gpus"], pool=pool).values()) == 4
        assert len(leader["gpufleet_gpu_info"]) == 4
        assert PROCESS_SERIES <= set(follower)
        assert [n for n in follower if n in FLEET_SERIES] == []
        assert "gpufleet_pool" not in await scrape_text(api_b)  # no empty families either
        assert (leader["gpufleet_leader"][()], follower["gpufleet_leader"][()]) == (1, 0)

        await leader_stack.aclose()

        async def took_over() -> bool:
            return b.leadership.is_leader

        await eventually(took_over, within_s=60)
        now = await _scrape(api_b)
        assert FLEET_SERIES <= set(now)
        assert sum(_by(now["gpufleet_pool_gpus"], pool=pool).values()) == 4
        assert {dict(k)["UUID"] for k in now["gpufleet_gpu_info"]} == {
            f"GPU-n1-{i}" for i in range(4)
        }
        assert now["gpufleet_leader"][()] == 1
