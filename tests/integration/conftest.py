"""Two ways to reach the API, and an HTTP helper for both.

`served`: the API app alone, in-process under aiohttp's test client, over a ledger with
a fake clock and a recording alert sink: no NATS, no loops. For what the API decides
(decoding, auth, rendering, the workflows it calls).

`coordinator` / `clocked`: the whole running coordinator (migrations, NATS and its
JetStream stream, the loops, the HTTP socket). For tests about NATS, the loops
(reservation clock, sweeper) or the running process.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from coordinator.api.app import build_app
from coordinator.api.http.context import Services
from coordinator.app import Coordinator, running_coordinator
from coordinator.config import CoordinatorSettings
from coordinator.ledger import Ledger
from coordinator.wiring.ledger import bootstrap_operator
from ops.kit.keys import new_key
from procs.nats import ProbedNatsSettings
from procs.settings import nest
from shared.clock import FakeClock
from tests.fakes import RecordingAlerts
from tests.waiting import eventually


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

    async def maintenance_once_registered(self, node_id: str, reason: str) -> None:
        """Put a node an agent is bringing up in maintenance: NOT_FOUND until the
        coordinator has its inventory, so retried until it is there."""
        body = {"nodeId": node_id, "maintenance": True, "reason": reason}

        async def accepted() -> bool:
            status, _ = await self.call("nodes.setMaintenance", body)
            return status == 200

        await eventually(accepted, within_s=20)


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
    # The NATS ones by their outside names (`nats_credentials=`), as an operator gives them.
    nested = nest(CoordinatorSettings, values | overrides)
    return CoordinatorSettings(**nested | {"nats": ProbedNatsSettings(**nested["nats"])})


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


@dataclass
class Served:
    api: Api
    ledger: Ledger
    clock: FakeClock
    alerts: RecordingAlerts
    database_url: str


@pytest.fixture
async def served(database_url: str, clock: FakeClock) -> AsyncIterator[Served]:
    """The API app in-process (aiohttp's test client) on a fresh ledger, on the `clock`
    fixture's time, with the coordinator's default notice; no NATS, no loops."""
    ledger = await Ledger.open(database_url)
    try:
        key = new_key()
        await bootstrap_operator(ledger, key, clock.now_ms())
        alerts = RecordingAlerts()
        app = build_app(Services(ledger, clock, alerts))
        async with TestClient(TestServer(app)) as client:
            base = str(client.make_url("")).rstrip("/")
            yield Served(Api(client.session, base, key), ledger, clock, alerts, database_url)
    finally:
        await ledger.close()
