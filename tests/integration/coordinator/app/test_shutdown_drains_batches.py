"""Leaving `running_coordinator` waits for the create batches being written: a batch
that started before shutdown commits and answers its requests before the ledger and the
bus close under it (coordinator/wiring/http.py pushes `Services.close`, which awaits the
reservations service's `GroupCommit.drain`)."""

from __future__ import annotations

import asyncio

from coordinator.api.http.server import SERVICES
from coordinator.app import running_coordinator
from tests.integration.conftest import coordinator_settings


async def test_shutdown_waits_for_the_batch_being_written(database_url: str, nats_url: str) -> None:
    started = asyncio.Event()
    written: list[list[str]] = []

    async def write(batch: list[str]) -> list[str | Exception]:
        # A batch still writing when the stop comes (as a create's commit can be).
        started.set()
        await asyncio.sleep(0.3)
        written.append(batch)
        return batch

    async with running_coordinator(coordinator_settings(database_url, nats_url)) as c:
        batches = c.http.app[SERVICES].reservations.batches
        waiting = asyncio.create_task(batches.submit("pool-a", "create-1", write))
        await started.wait()
    # Out of the context: the batch had committed, and its request had its answer.
    assert written == [["create-1"]]
    assert waiting.done() and waiting.result() == "create-1"
