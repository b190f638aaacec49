"""A running coordinator (in-process, real NATS, real HTTP socket) and an HTTP helper."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from coordinator.app import Coordinator, running_coordinator
from coordinator.config import CoordinatorSettings
from coordinator.domain.clock import FakeClock
from ops.cli import new_key


@dataclass
class Api:
    session: aiohttp.ClientSession
    base: str
    operator_key: str

    async def call(
        self, method: str, body: Any, key: str | None = None, raw: bytes | None = None
    ) -> tuple[int, Any]:
        module, name = method.split(".", 1)
        headers = {"Authorization": f"Bearer {key or self.operator_key}"}
        data = raw if raw is not None else None
        kwargs: dict[str, Any] = {"data": data} if raw is not None else {"json": body}
        async with self.session.post(
            f"{self.base}/api/compute/{module}/{name}", headers=headers, **kwargs
        ) as resp:
            return resp.status, await resp.json()

    async def ok(self, method: str, body: Any, key: str | None = None) -> Any:
        status, payload = await self.call(method, body, key)
        assert status == 200, payload
        return payload


def coordinator_settings(database_url: str, nats_url: str, **overrides: Any) -> CoordinatorSettings:
    values: dict[str, Any] = {
        "database_url": database_url,
        "nats_url": nats_url,
        "http_port": 0,
        "bootstrap_operator_key": new_key(),
        "subject_prefix": f"t{secrets.token_hex(4)}",
        "sweep_interval_s": 0.1,
        "flush_interval_s": 0.2,
        "recovery_hold_s": 0.5,
        # The session's nats-server has no users: these tests say so.
        "insecure_bus": True,
    }
    return CoordinatorSettings(**(values | overrides))


@pytest.fixture
async def coordinator(database_url: str, nats_url: str) -> AsyncIterator[Coordinator]:
    async with running_coordinator(coordinator_settings(database_url, nats_url)) as c:
        yield c


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_800_000_000_000)


@pytest.fixture
async def clocked(database_url: str, nats_url: str, clock: FakeClock) -> AsyncIterator[Coordinator]:
    """A coordinator whose clock moves only when the test moves it."""
    settings = coordinator_settings(database_url, nats_url, reservation_tick_s=0.05, notice_s=120)
    async with running_coordinator(settings, clock) as c:
        yield c


@pytest.fixture
async def capi(clocked: Coordinator) -> AsyncIterator[Api]:
    key = clocked.settings.bootstrap_operator_key
    assert key is not None
    async with aiohttp.ClientSession() as session:
        yield Api(session, clocked.url, key)


@pytest.fixture
async def api(coordinator: Coordinator) -> AsyncIterator[Api]:
    key = coordinator.settings.bootstrap_operator_key
    assert key is not None
    async with aiohttp.ClientSession() as session:
        yield Api(session, coordinator.url, key)
