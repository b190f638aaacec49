"""The coordinator the use tests run against (`used`): use passes every 50 ms, idle after
`IDLE_AFTER_S`, flushed at once."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from coordinator.app import Coordinator, running_coordinator
from shared.clock import FakeClock
from tests.integration.conftest import coordinator_settings
from tests.integration.coordinator.services.use_agent import IDLE_AFTER_S


@pytest.fixture
async def used(database_url: str, nats_url: str, clock: FakeClock) -> AsyncIterator[Coordinator]:
    settings = coordinator_settings(
        database_url, nats_url, use_interval_s=0.05, idle_after_s=IDLE_AFTER_S, use_flush_s=0,
        reservation_tick_s=0.05,
    )  # fmt: skip
    async with running_coordinator(settings, clock) as c:
        yield c
