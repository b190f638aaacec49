"""What the coordinator's NATS client drops or is refused is counted and logged at
warning, never at debug (SPEC §4: dropped messages are counted). Real nats-server."""

from __future__ import annotations

import asyncio
import logging
import time

import nats
import pytest
from nats.aio.msg import Msg

from coordinator.bus.connection import Bus
from coordinator.bus.ingest import Ingest
from coordinator.runtime.metrics import Metrics, Sources
from procs.nats import NatsSettings
from shared.ids import new_pool_id
from shared.subjects import Subjects
from shared.wire import Heartbeat, Inventory
from tests.waiting import eventually


async def test_slow_consumer_drops_are_counted_logged_and_exported(
    nats_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    bus = Bus(NatsSettings(url=nats_url), pending_msgs_limit=5)
    await bus.connect(attempts=1)
    release = asyncio.Event()

    async def stuck(msg: Msg) -> None:
        await release.wait()

    try:
        with caplog.at_level(logging.WARNING, logger="coordinator.bus.connection"):
            await bus.subscribe("slow.test", stuck)
            for i in range(50):
                await bus.publish("slow.test", str(i).encode())
            await bus.flush()

            async def dropped() -> bool:
                return bus.errors.get("slow_consumer", 0) >= 40

            await eventually(dropped, within_s=5)
        # Logged at warning, once per period however many were dropped.
        lines = [r for r in caplog.records if "slow_consumer" in r.getMessage()]
        assert len(lines) == 1 and lines[0].levelno == logging.WARNING
        assert "slow.test" in lines[0].getMessage()
        text = Metrics(Sources(nats_errors=bus.errors)).render().decode()
        assert (
            f'gpufleet_nats_errors_total{{kind="slow_consumer"}} {bus.errors["slow_consumer"]}.0'
            in text
        )
    finally:
        release.set()
        await bus.close()


class NullSink:
    def on_heartbeat(self, hb: Heartbeat) -> None: ...

    def on_inventory(self, inv: Inventory) -> None: ...


def test_each_drop_reason_is_logged_at_warning_with_the_node_id(
    caplog: pytest.LogCaptureFixture,
) -> None:
    subjects = Subjects("t")
    ingest = Ingest(subjects, NullSink())
    pool = new_pool_id()
    with caplog.at_level(logging.WARNING, logger="coordinator.bus.ingest"):
        for _ in range(3):
            ingest.handle(subjects.heartbeat(pool, "gpu-7"), b"not json")
        ingest.handle(subjects.heartbeat(pool, "gpu-8"), b'{"nodeId": 1}')
        ingest.handle(subjects.heartbeat(pool, "gpu-9"), b"x" * 100_000)
    assert ingest.dropped == {"not_json": 3, "bad_schema": 1, "too_large": 1}
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(messages) == 3  # one per reason: the flood from gpu-7 is not a log flood
    for node, reason in (("gpu-7", "not_json"), ("gpu-8", "bad_schema"), ("gpu-9", "too_large")):
        assert any(f"node {node}" in m and reason in m for m in messages), messages
    # A schema error says which field broke the schema, as the wire model's decoder found.
    assert any("bad_schema" in m and "at `$.nodeId`" in m for m in messages), messages


async def test_a_batched_subscription_handles_or_counts_every_message(nats_url: str) -> None:
    """The heartbeat subscription (`Bus.subscribe_batched`) is bounded: what does not fit
    is dropped, counted as a slow consumer and reported as falling behind; everything
    else reaches the handler, messages with a reply subject included."""
    behind: list[str] = []
    bus = Bus(NatsSettings(url=nats_url), pending_msgs_limit=5, on_behind=behind.append)
    await bus.connect(attempts=1)
    handled: list[tuple[str, bytes]] = []
    try:
        await bus.subscribe_batched("lane.>", lambda msg: handled.append((msg.subject, msg.data)))
        assert bus.nc is not None
        await bus.nc.publish("lane.asks", b"question", reply="lane-replies")
        for i in range(2000):
            await bus.publish(f"lane.{i % 7}", str(i).encode())
        await bus.flush()

        async def all_accounted() -> bool:
            return len(handled) + bus.errors.get("slow_consumer", 0) == 2001

        await eventually(all_accounted, within_s=10)
        assert bus.errors["slow_consumer"] > 0  # 2,000 at once into a queue of 5
        assert len(behind) == bus.errors["slow_consumer"]
        assert all(subject.startswith("lane.") for subject in behind)
        assert ("lane.asks", b"question") in handled
        assert all(subject.startswith("lane.") for subject, _ in handled)
        assert bus.backlog() == 0
    finally:
        await bus.close()


def test_a_message_the_client_dropped_on_a_node_subject_is_an_ingest_drop() -> None:
    subjects = Subjects("t")
    ingest = Ingest(subjects, NullSink())
    pool = new_pool_id()
    ingest.lost(subjects.heartbeat(pool, "gpu-7"))
    ingest.lost(subjects.use(pool, "gpu-7"))
    ingest.lost("t.alert.x.y.z")  # not ingest's: the NATS error counter has it
    assert ingest.dropped == {"slow_consumer": 2}


async def test_a_busy_link_is_not_taken_as_dead_and_loses_nothing(nats_url: str) -> None:
    """Issue 32: on a starved machine the probe's PONG queues behind every message the
    server holds for us. A probe that times out while messages keep arriving is late,
    not a dead link: no reconnect (which would lose what the server holds, uncounted),
    and every message is handled."""
    downs: list[int] = []
    bus = Bus(NatsSettings(url=nats_url), probe_timeout_s=0.3, on_down=lambda: downs.append(1))
    await bus.connect(attempts=1)
    handled = [0]
    starving = asyncio.Event()
    starving.set()

    async def hog() -> None:
        # Each turn of the event loop costs 50 ms: the socket is read slowly.
        while starving.is_set():
            time.sleep(0.05)  # noqa: ASYNC251 - blocking is the point: a starved loop
            await asyncio.sleep(0)

    count = 20_000
    sender = await nats.connect(nats_url)
    try:
        await bus.subscribe_batched("busy.>", lambda _: handled.__setitem__(0, handled[0] + 1))
        await bus.flush()
        payload = b"x" * 300
        for i in range(count):
            await sender.publish(f"busy.{i % 50}", payload)
        await sender.flush()
        task = asyncio.create_task(hog())
        await bus.probe()
        starving.clear()
        await task
        assert (bus.probe_late, bus.probe_failures, downs) == (1, 0, [])

        async def all_handled() -> bool:
            return handled[0] == count

        await eventually(all_handled, within_s=30)
        # The late PONG came and went: the link still reads what comes next.
        for i in range(1000):
            await sender.publish(f"busy.{i % 50}", payload)
        await sender.flush()
        count += 1000
        await eventually(all_handled, within_s=10)
        assert bus.errors == {} and downs == []
    finally:
        starving.clear()
        await sender.close()
        await bus.close()
