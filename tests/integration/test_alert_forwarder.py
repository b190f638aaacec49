"""`gpufleet alerts forward`: the JetStream alert stream delivered to a real HTTP receiver
(Alertmanager's API and a webhook), at least once, across failures and its own restart."""

from __future__ import annotations

import asyncio
import secrets
import signal
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from coordinator.bus.alerts import AlertStream
from coordinator.bus.connection import Bus
from ops.alert_forwarder import AlertForwarder, ForwarderSettings
from ops.cli import run
from shared.subjects import Subjects
from shared.wire import Alert
from tests.waiting import eventually


class Receiver:
    """Alertmanager's `POST /api/v2/alerts` and a webhook; answers 503 while `failing`."""

    def __init__(self) -> None:
        self.failing = 0  # how many more requests to refuse; -1: all of them
        self.am: list[dict[str, Any]] = []
        self.hooks: list[dict[str, Any]] = []
        self.refused = 0
        self.url = ""

    async def _answer(self, request: web.Request, into: list[dict[str, Any]]) -> web.Response:
        if self.failing:
            self.failing -= 1 if self.failing > 0 else 0
            self.refused += 1
            return web.Response(status=503, text="not now")
        body = await request.json()
        into.extend(body if isinstance(body, list) else [body])
        return web.json_response({})

    @asynccontextmanager
    async def serving(self) -> AsyncIterator[Receiver]:
        async def alertmanager(request: web.Request) -> web.Response:
            return await self._answer(request, self.am)

        async def hook(request: web.Request) -> web.Response:
            return await self._answer(request, self.hooks)

        app = web.Application()
        app.router.add_post("/api/v2/alerts", alertmanager)
        app.router.add_post("/hook", hook)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        try:
            yield self
        finally:
            await runner.cleanup()


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    async with Receiver().serving() as r:
        yield r


@pytest.fixture
async def publisher(nats_url: str) -> AsyncIterator[AlertStream]:
    """The coordinator's own publisher and stream, under a prefix of this test's own."""
    bus = Bus(nats_url)
    await bus.connect()
    alerts = AlertStream(bus, Subjects(f"t{secrets.token_hex(4)}"))
    await alerts.setup()
    try:
        yield alerts
    finally:
        await bus.close()


def _alert(kind: str, n: int, **extra: Any) -> Alert:
    return Alert(
        alert_id=f"a{n:03d}", kind=kind, pool_id="pool-a", node_id="gpu-01.example.net",  # type: ignore[arg-type]
        at=1_800_000_000_000 + n * 1000, reason=f"reason {n}", **extra,
    )  # fmt: skip


@asynccontextmanager
async def forwarding(settings: ForwarderSettings) -> AsyncIterator[AlertForwarder]:
    forwarder = AlertForwarder(settings)
    task = asyncio.create_task(forwarder.run(), name="forwarder")
    try:
        yield forwarder
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


def _settings(nats_url: str, publisher: AlertStream, receiver: Receiver) -> ForwarderSettings:
    return ForwarderSettings(
        nats_url=nats_url,
        subject_prefix=publisher.subjects.prefix,
        alertmanager=(receiver.url,),
        webhooks=(receiver.url + "/hook",),
        backoff_initial_s=0.05,
        backoff_max_s=0.2,
        labels={"cluster": "test"},
    )


async def test_alerts_reach_alertmanager_and_a_webhook_after_retries(
    nats_url: str, publisher: AlertStream, receiver: Receiver
) -> None:
    receiver.failing = 3
    async with forwarding(_settings(nats_url, publisher, receiver)):
        await publisher.publish(_alert("device.unhealthy", 1, device_id="GPU-1"))
        await publisher.publish(_alert("device.healthy", 2, device_id="GPU-1"))
        await publisher.publish(_alert("node.registered", 3))

        async def all_in() -> bool:
            return len(receiver.hooks) >= 3 and len(receiver.am) >= 5

        await eventually(all_in, within_s=10)
    assert receiver.refused == 3
    assert [h["alertId"] for h in receiver.hooks] == ["a001", "a002", "a003"]
    assert receiver.hooks[0]["kind"] == "device.unhealthy"
    fired = receiver.am[0]
    assert fired["labels"] == {
        "alertname": "GpufleetDeviceUnhealthy", "severity": "warning", "pool": "pool-a",
        "node": "gpu-01.example.net", "device": "GPU-1", "cluster": "test",
    }  # fmt: skip
    assert fired["startsAt"] == "2027-01-15T08:00:01.000Z"
    assert fired["endsAt"] > fired["startsAt"]
    assert fired["annotations"]["description"] == "reason 1"
    # device.healthy ends the conditions it can end: same labels, endsAt at the transition.
    resolved = [a for a in receiver.am if a["endsAt"] == "2027-01-15T08:00:02.000Z"]
    assert fired["labels"] in [a["labels"] for a in resolved]
    event = receiver.am[-1]
    assert event["labels"]["alertname"] == "GpufleetNodeRegistered"


async def test_nothing_is_lost_across_a_restart_and_nothing_acked_comes_back(
    nats_url: str, publisher: AlertStream, receiver: Receiver
) -> None:
    settings = _settings(nats_url, publisher, receiver)
    receiver.failing = -1
    async with forwarding(settings):
        for n in range(3):
            await publisher.publish(_alert("node.unreachable", n))

        async def retrying() -> bool:
            return receiver.refused >= 3

        await eventually(retrying, within_s=10)
    # Stopped while the receiver was down; two more alerts while nobody forwards.
    for n in range(3, 5):
        await publisher.publish(_alert("node.reachable", n))
    receiver.failing = 0
    async with forwarding(settings) as second:

        async def caught_up() -> bool:
            return second.delivered >= 5

        await eventually(caught_up, within_s=10)
    assert {h["alertId"] for h in receiver.hooks} == {f"a{n:03d}" for n in range(5)}
    seen = len(receiver.hooks)
    # Everything was acknowledged: a third start delivers nothing again.
    async with forwarding(settings) as third:
        await publisher.publish(_alert("node.registered", 9))

        async def the_new_one() -> bool:
            return third.delivered >= 1

        await eventually(the_new_one, within_s=10)
        await asyncio.sleep(0.3)
    assert [h["alertId"] for h in receiver.hooks[seen:]] == ["a009"]


def test_the_cli_refuses_a_forwarder_without_a_target_or_with_a_bad_url(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run(["alerts", "forward"], {}) == 2
    assert "no target" in capsys.readouterr().err
    assert run(["alerts", "forward", "--webhook", "ftp://x"], {}) == 2
    assert "not an http(s) URL" in capsys.readouterr().err


async def _start_process(config: Path) -> asyncio.subprocess.Process:
    """`gpufleet-alerts forward` as systemd starts it, once its durable consumer is bound."""
    proc = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).parent / "gpufleet-alerts"), "forward", "--config", str(config),
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stderr is not None
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        line = await asyncio.wait_for(proc.stderr.readline(), timeout=20)
        assert line, "gpufleet-alerts exited before it was ready"
        if b"forwarding " in line:
            return proc
    raise AssertionError("gpufleet-alerts did not bind its consumer")


async def _stop_process(proc: asyncio.subprocess.Process) -> bytes:
    """SIGTERM, as `systemctl restart` sends; it exits 0 within TimeoutStopSec."""
    proc.send_signal(signal.SIGTERM)
    assert proc.stderr is not None
    rest = await asyncio.wait_for(proc.stderr.read(), timeout=10)
    assert await proc.wait() == 0, rest
    return rest


async def test_the_forward_process_loses_nothing_across_a_sigterm_restart(
    nats_url: str, publisher: AlertStream, receiver: Receiver, tmp_path: Path
) -> None:
    config = tmp_path / "alerts.toml"
    config.write_text(
        "[alerts]\n"
        f'nats_url = "{nats_url}"\n'
        f'subject_prefix = "{publisher.subjects.prefix}"\n'
        f'webhooks = ["{receiver.url}/hook"]\n'
        "backoff_initial_s = 0.05\nbackoff_max_s = 0.2\n"
    )
    receiver.failing = -1
    first = await _start_process(config)
    try:
        for n in range(3):
            await publisher.publish(_alert("node.unreachable", n))

        async def retrying() -> bool:
            return receiver.refused >= 3

        await eventually(retrying, within_s=10)
    finally:
        # Restarted while the receiver refuses: the batch in hand is handed back.
        await _stop_process(first)
    for n in range(3, 5):
        await publisher.publish(_alert("node.reachable", n))
    receiver.failing = 0
    second = await _start_process(config)
    try:
        # Well within JetStream's 30 s ack wait: nothing waits for a redelivery timer.
        async def caught_up() -> bool:
            return {h["alertId"] for h in receiver.hooks} == {f"a{n:03d}" for n in range(5)}

        await eventually(caught_up, within_s=10)
    finally:
        await _stop_process(second)
