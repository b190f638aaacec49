"""Alerts are kept in a bounded JetStream stream: a subscriber that was away catches up."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import nats
import pytest

from coordinator.app import Coordinator, running_coordinator
from coordinator.services.node_records import record_inventory
from shared.streams import stream_name
from shared.subjects import Subjects
from shared.wire import Alert
from tests.factories import make_inventory
from tests.integration.conftest import Api, coordinator_settings
from tests.waiting import eventually


@pytest.fixture
async def small_stream(database_url: str, nats_url: str) -> AsyncIterator[Coordinator]:
    settings = coordinator_settings(database_url, nats_url, alert_stream_max_msgs=3)
    async with running_coordinator(settings) as c:
        yield c


async def test_a_late_subscriber_reads_the_alerts_it_missed_within_the_bound(
    small_stream: Coordinator,
) -> None:
    c = small_stream
    key = c.settings.bootstrap_operator_key
    assert key
    async with aiohttp.ClientSession() as session:
        api = Api(session, c.url, key)
        await api.ok("tenants.create", {"tenantId": "acme"})
        pool = (await api.ok("pools.create", {"tenantId": "acme", "name": "p"}))["poolId"]
        await record_inventory(c.ledger, make_inventory("n1", pool), 1)
        # Five alerts while nobody listens.
        for i in range(5):
            await api.ok(
                "nodes.setMaintenance",
                {"nodeId": "n1", "maintenance": i % 2 == 0, "reason": f"step {i}"},
            )

    async def all_sent() -> bool:
        # Published from the outbox just after each commit.
        return (await c.ledger.outbox.backlog()).unsent == 0

    await eventually(all_sent)
    subjects = Subjects(c.settings.nats.subject_prefix)
    nc = await nats.connect(c.settings.nats.url)
    try:
        js = nc.jetstream()
        info = await js.stream_info(stream_name(subjects.prefix))
        assert info.config.max_msgs == 3
        sub = await js.pull_subscribe(subjects.all_alerts, stream=stream_name(subjects.prefix))
        msgs = await sub.fetch(10, timeout=2)
        alerts = [Alert.from_json(m.data) for m in msgs]
        # Only the newest three are kept: bounded retention.
        assert [a.details["maintenance"] for a in alerts] == [True, False, True]
        assert [a.kind for a in alerts] == [
            "node.maintenance",
            "node.maintenanceEnded",
            "node.maintenance",
        ]
        assert {a.node_id for a in alerts} == {"n1"}
    finally:
        await nc.close()
