"""An agent stops promptly when told, whatever its NATS server is doing: with the server
hung (SIGSTOP: its probe, publishes and replies all wait on it) the agent's loops end
and `run` returns 0 well within systemd's stop timeout, as with a healthy server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from agent.main import run
from ops.kit.embedded_nats import EmbeddedNats
from tests.integration.agent.test_nats import bus_for, settings
from tests.waiting import eventually

# A backstop: measured 0.3-1.3 s with two cores at load 6.5, healthy or hung server.
GRACE_S = 5.0


@pytest.fixture
def own_nats() -> Iterator[EmbeddedNats]:
    """A nats-server of this test's own, to be paused."""
    with EmbeddedNats() as server:
        yield server


@pytest.mark.parametrize("server", ["healthy", "hung"])
async def test_an_agent_stops_within_its_grace(
    own_nats: EmbeddedNats, server: str, caplog: pytest.LogCaptureFixture
) -> None:
    s = settings(own_nats.url)
    stop = asyncio.Event()
    async with bus_for(own_nats.url, s) as bus:
        task = asyncio.create_task(run(s, stop=stop, install_signals=False))
        try:
            await bus.heartbeat(wait=30)  # connected and publishing
            if server == "hung":
                own_nats.pause()

                async def waited_on_it() -> bool:
                    return any("no answer from NATS" in r.getMessage() for r in caplog.records)

                # Its probe waited out the hung server; now it tries to reconnect.
                await eventually(waited_on_it)
        finally:
            started = time.monotonic()
            stop.set()
            done, _ = await asyncio.wait({task}, timeout=GRACE_S)
            took = time.monotonic() - started
            own_nats.resume()
        if not done:
            task.cancel()
            await asyncio.wait({task}, timeout=GRACE_S)
            raise AssertionError(f"the agent did not stop within {GRACE_S:.0f} s")
    assert task.result() == 0
    assert took < GRACE_S
