"""The alert outbox: an alert is committed with its transition and reaches the JetStream
stream exactly once, even when the coordinator died between the commit and the publish,
when it is sent again, or when JetStream was away at the time."""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import nats
import pytest
from sqlalchemy import update

from coordinator.app import Coordinator, running_coordinator
from coordinator.bus.alerts import MSG_ID
from coordinator.ledger import Ledger, schema
from coordinator.services.node_records import record_inventory
from ops.kit.embedded_nats import EmbeddedNats
from shared.streams import stream_name
from shared.wire import Alert
from tests.database import database
from tests.factories import make_inventory
from tests.integration.conftest import Api, coordinator_settings
from tests.rig import Rig
from tests.waiting import eventually


async def stream_alerts(nats_url: str, prefix: str) -> list[tuple[str, Alert]]:
    """Every message in the alert stream: (its Nats-Msg-Id, the alert)."""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        name = stream_name(prefix)
        info = await js.stream_info(name)
        out: list[tuple[str, Alert]] = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            msg = await js.get_msg(name, seq)
            assert msg.data is not None
            out.append(((msg.headers or {}).get(MSG_ID, ""), Alert.from_json(msg.data)))
        return out
    finally:
        await nc.close()


async def unsent(ledger: Ledger) -> int:
    return (await ledger.outbox.backlog()).unsent


async def outbox_ids(ledger: Ledger) -> list[str]:
    return [p.alert.alert_id for p in await ledger.outbox.unsent(1000)]


async def test_alerts_committed_by_a_coordinator_that_died_before_publishing_go_out_after_restart(
    database_url: str, nats_url: str
) -> None:
    # What a coordinator killed between commit and publish leaves: committed transitions
    # (a registration, a maintenance) whose alerts nobody published.
    ledger = await Ledger.open(database_url)
    try:
        rig = await Rig.open(ledger)
        pool = await rig.pool(nodes=1)
        node = f"{pool[-6:]}-n0"
        await rig.maintenance.set(node, True, "disk swap", "ops")
        committed = await outbox_ids(ledger)
        assert len(committed) == 2
        assert [a.alert_id for a in rig.alerts.alerts] == committed[1:]
    finally:
        await ledger.close()

    settings = coordinator_settings(database_url, nats_url)
    async with running_coordinator(settings) as c:

        async def drained() -> bool:
            return await unsent(c.ledger) == 0

        await eventually(drained)
        stored = await stream_alerts(nats_url, settings.nats.subject_prefix)
    assert [alert.alert_id for _, alert in stored] == committed
    assert [msg_id for msg_id, _ in stored] == committed
    assert [alert.kind for _, alert in stored] == ["node.registered", "node.maintenance"]


async def test_an_alert_sent_again_is_stored_once(coordinator: Coordinator) -> None:
    """A coordinator that published and died before marking the row sent publishes it
    again after restart (or its successor does): the stream de-duplicates by alert id."""
    c = coordinator
    rig = await Rig.open(c.ledger)
    await rig.pool(nodes=2)

    async def drained() -> bool:
        return await unsent(c.ledger) == 0

    await eventually(drained)
    first = await stream_alerts(c.settings.nats.url, c.settings.nats.subject_prefix)
    assert len(first) == 2
    # Forget that they were sent, as a crash before the mark would have.
    async with database(c.settings.effective_database_url) as db, db.transaction() as conn:
        await conn.execute(update(schema.alert_outbox).values(sent_at=None))
    await c.relay.publish(first[0][1])  # wake it
    await eventually(drained)
    again = await stream_alerts(c.settings.nats.url, c.settings.nats.subject_prefix)
    assert again == first
    assert c.stream.duplicates == 2


async def _metric(session: aiohttp.ClientSession, base: str, name: str, key: str) -> float:
    # /metrics names tenants' pools: it answers an operator key (or its own token).
    headers = {"Authorization": f"Bearer {key}"}
    async with session.get(f"{base}/metrics", headers=headers) as resp:
        text = await resp.text()
    found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    assert found, name
    return float(found.group(1))


@pytest.fixture
async def own_nats(tmp_path: Path) -> AsyncIterator[EmbeddedNats]:
    with EmbeddedNats(store_dir=str(tmp_path / "js")) as server:
        yield server


async def test_alerts_wait_in_the_outbox_while_jetstream_is_away_then_go_out_once(
    database_url: str, own_nats: EmbeddedNats
) -> None:
    """The issue's loss: the stream's server down when a transition happens. The
    transition is acknowledged, its alert waits (backlog and age on /metrics) and is
    retried until the server is back, then stored once."""
    settings = coordinator_settings(database_url, own_nats.url, alert_publish_timeout_s=0.5)
    key = settings.bootstrap_operator_key
    assert key
    async with running_coordinator(settings) as c, aiohttp.ClientSession() as session:
        api = Api(session, c.url, key)
        await api.ok("tenants.create", {"tenantId": "acme"})
        pool = (await api.ok("pools.create", {"tenantId": "acme", "name": "p"}))["poolId"]
        await record_inventory(c.ledger, make_inventory("n1", pool), int(time.time() * 1000))

        async def drained() -> bool:
            return await unsent(c.ledger) == 0

        await eventually(drained)
        own_nats.stop()
        await api.ok("nodes.setMaintenance", {"nodeId": "n1", "maintenance": True, "reason": "x"})

        async def waiting() -> bool:
            return (
                c.relay.failures > 0
                and await _metric(session, c.url, "gpufleet_alert_outbox_backlog", key) == 1
            )

        await eventually(waiting)
        assert await _metric(session, c.url, "gpufleet_alert_outbox_oldest_age_seconds", key) >= 0
        own_nats.start()
        await eventually(drained, within_s=20)
        stored = await stream_alerts(own_nats.url, settings.nats.subject_prefix)
    kinds = [alert.kind for _, alert in stored]
    assert kinds == ["node.registered", "node.maintenance"]
    assert len({msg_id for msg_id, _ in stored}) == 2
