"""A NATS URL may carry a password (`nats://user:pass@host:4222`); no process logs or
prints it: the coordinator's bus and the agent's publisher name the server they are on
by host:port, and the URL as given goes through `procs.redact` wherever it is said (a
server that cannot be reached, a URL that is not one). Real nats-server, requiring that
user and password."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.publisher import Publisher
from coordinator.bus.connection import Bus
from ops.kit.embedded_nats import EmbeddedNats, free_port
from procs.nats import NatsSettings, split_servers
from procs.nats_connect import Retry, connect
from procs.redact import redact
from shared.clock import SystemClock
from shared.ids import new_pool_id
from shared.subjects import Subjects
from tests.waiting import eventually

PASSWORD = "s3cret-" + secrets.token_hex(4)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[EmbeddedNats]:
    config = tmp_path / "auth.conf"
    config.write_text(f'authorization {{ user: "fleet", password: "{PASSWORD}" }}\n')
    with EmbeddedNats(config_file=str(config)) as running:
        yield running


def _with_password(port: int) -> str:
    return f"nats://fleet:{PASSWORD}@127.0.0.1:{port}"


def test_redact_hides_each_seed_s_credentials_and_keeps_where_it_is() -> None:
    urls = f"nats://fleet:{PASSWORD}@n1:4222, tls://agent:{PASSWORD}@n2:4443,nats://n3:4222"
    assert redact(urls) == "nats://***@n1:4222, tls://***@n2:4443,nats://n3:4222"
    with pytest.raises(ValueError) as bad:
        split_servers(f"nats://fleet:{PASSWORD}@n1:99999")
    assert PASSWORD not in str(bad.value) and "n1:99999" in str(bad.value)


async def test_the_coordinator_s_bus_names_its_server_without_the_password(
    server: EmbeddedNats, caplog: pytest.LogCaptureFixture
) -> None:
    bus = Bus(NatsSettings(url=_with_password(server.port)))
    with caplog.at_level(logging.DEBUG):
        await bus.connect(attempts=1)
        try:
            assert bus.connected_server == f"127.0.0.1:{server.port}"
        finally:
            await bus.close()
    assert f"connected to NATS at 127.0.0.1:{server.port}" in caplog.text
    assert PASSWORD not in caplog.text


async def test_the_agent_names_its_server_without_the_password(
    server: EmbeddedNats, caplog: pytest.LogCaptureFixture
) -> None:
    pub = Publisher(
        nats=NatsSettings(url=_with_password(server.port)), subjects=Subjects("t"),
        pool_id=new_pool_id(), node_id="n1", boot_id="b", interval_s=1.0, clock=SystemClock(),
    )  # fmt: skip
    with caplog.at_level(logging.DEBUG):
        task = asyncio.create_task(pub.run())
        try:

            async def connected() -> bool:
                return pub.connected

            await eventually(connected)
            assert pub.server == f"127.0.0.1:{server.port}"
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    assert f"connected to 127.0.0.1:{server.port}" in caplog.text
    assert PASSWORD not in caplog.text


async def test_a_server_that_cannot_be_reached_is_logged_without_the_password(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Every process's first connect (procs.nats_connect) says which server it retries.
    gone = _with_password(free_port())
    log = logging.getLogger("test.nats")
    retry = Retry(first_s=0.05, max_s=0.05)
    # One try per server (as `gpufleet alerts tail` makes it), retried by `connect`.
    options = {"allow_reconnect": False, "max_reconnect_attempts": 1, "connect_timeout": 1,
               "reconnect_time_wait": 0.1}  # fmt: skip
    with caplog.at_level(logging.WARNING), contextlib.suppress(TimeoutError):
        await asyncio.wait_for(connect(NatsSettings(url=gone), options, retry=retry, log=log), 3)
    said = [r.getMessage() for r in caplog.records if r.name == "test.nats"]
    assert said and all("NATS at nats://***@127.0.0.1:" in line for line in said), said
    assert PASSWORD not in caplog.text
