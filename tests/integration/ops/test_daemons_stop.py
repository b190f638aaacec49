"""The alert forwarder and the Slurm bridge stop promptly when cancelled (what SIGTERM
does to them, `procs.signals`), busy or not: the forwarder with its nats-server hung
(SIGSTOP), the bridge mid-pass on a coordinator that never answers and with its
nats-server hung. What each does on the way out is bounded: the hand-back of alerts it
holds waits out its open pull (`fetch_wait_s`), then one flush."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import pytest

from coordinator.bus.alerts import AlertStream
from coordinator.bus.connection import Bus
from ops.forwarder.daemon import AlertForwarder
from ops.forwarder.settings import ForwarderSettings
from ops.kit.embedded_nats import EmbeddedNats
from ops.slurm.bridge.daemon import SlurmBridge
from ops.slurm.bridge.settings import BridgeSettings
from procs.nats import NatsSettings, ProbedNatsSettings
from shared.subjects import Subjects
from tests.waiting import eventually

# A backstop: measured 1.2 s (forwarder, the hand-back's pull) to 3.2 s (hung server:
# that pull, then the flush's 2 s) with two cores at load 6.5; their systemd units give
# 30 s (TimeoutStopSec).
GRACE_S = 8.0


@pytest.fixture
def own_nats() -> Iterator[EmbeddedNats]:
    """A nats-server of this test's own, to be paused."""
    with EmbeddedNats() as server:
        yield server


@pytest.fixture
async def stream(own_nats: EmbeddedNats) -> AsyncIterator[AlertStream]:
    """The coordinator's alert stream, under a prefix of this test's own."""
    bus = Bus(NatsSettings(url=own_nats.url))
    await bus.connect()
    alerts = AlertStream(bus, Subjects(f"t{secrets.token_hex(4)}"))
    await alerts.setup()
    try:
        yield alerts
    finally:
        own_nats.resume()
        await bus.close()


@asynccontextmanager
async def never_answering() -> AsyncIterator[tuple[str, list[asyncio.StreamWriter]]]:
    """An HTTP address that accepts connections and never answers (a coordinator that
    hangs), and the connections it holds."""
    held: list[asyncio.StreamWriter] = []

    async def accept(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", held
    finally:
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()


async def stop_within_grace(task: asyncio.Task[None], what: str) -> None:
    """Cancel `task`, as SIGTERM does; fail naming `what` when it overruns the grace."""
    started = time.monotonic()
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=GRACE_S)
    took = time.monotonic() - started
    if not done:
        task.cancel()
        await asyncio.wait({task}, timeout=GRACE_S)
        raise AssertionError(f"{what} did not stop within {GRACE_S:.0f} s of its cancel")
    assert task.cancelled(), task.exception()
    assert took < GRACE_S


@pytest.mark.parametrize("server", ["healthy", "hung"])
async def test_the_alert_forwarder_stops_within_its_grace(
    own_nats: EmbeddedNats, stream: AlertStream, server: str
) -> None:
    forwarder = AlertForwarder(
        ForwarderSettings(
            nats=ProbedNatsSettings(url=own_nats.url, subject_prefix=stream.subjects.prefix),
            webhooks=("http://127.0.0.1:9/hook",),
        )
    )  # fmt: skip
    task = asyncio.create_task(forwarder.run())
    await asyncio.wait_for(forwarder.ready.wait(), timeout=20)
    if server == "hung":
        own_nats.pause()
    await stop_within_grace(task, "the alert forwarder")


@pytest.mark.parametrize("server", ["healthy", "hung"])
async def test_the_slurm_bridge_mid_pass_stops_within_its_grace(
    own_nats: EmbeddedNats, stream: AlertStream, server: str
) -> None:
    async with never_answering() as (coordinator, held):
        bridge = SlurmBridge(
            BridgeSettings(
                nats=ProbedNatsSettings(url=own_nats.url, subject_prefix=stream.subjects.prefix),
                coordinator_url=coordinator, coordinator_key="unused",
                scontrol="/nonexistent/scontrol",
            )
        )  # fmt: skip
        task = asyncio.create_task(bridge.run())

        async def mid_pass() -> bool:
            return bool(held)  # its pass waits on the coordinator

        await eventually(mid_pass, within_s=20)
        if server == "hung":
            own_nats.pause()
        await stop_within_grace(task, "the Slurm bridge")
