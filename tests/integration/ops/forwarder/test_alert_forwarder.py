"""`gpufleet alerts forward`: the JetStream alert stream delivered to real HTTP receivers
(Alertmanager's API, a webhook, and a real Alertmanager), at least once, across target
failures, NATS errors, a deleted consumer and its own restart."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
from aiohttp import web
from msgspec.structs import replace
from nats.js.api import ConsumerConfig

from coordinator.bus.alerts import AlertStream
from coordinator.bus.connection import Bus
from ops.forwarder.conditions import rfc3339
from ops.forwarder.daemon import AlertForwarder, ForwarderSettings
from ops.forwarder.payloads import fingerprint
from ops.kit.alerts import ConsumerConflict
from ops.kit.embedded_nats import EmbeddedNats, free_port
from ops.kit.nats_users import forwarder_permissions
from ops.main import run
from procs.nats import NatsSettings, ProbedNatsSettings
from shared.streams import stream_name
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
    bus = Bus(NatsSettings(url=nats_url))
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


def _alert_ids(webhook_body: dict[str, Any]) -> list[str]:
    """The gpufleet alert ids a webhook notification is about."""
    return sorted({a["annotations"]["alertId"] for a in webhook_body["alerts"]})


def _now_rfc3339() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


@asynccontextmanager
async def forwarding(settings: ForwarderSettings) -> AsyncIterator[AlertForwarder]:
    forwarder = AlertForwarder(settings)
    task = asyncio.create_task(forwarder.run(), name="forwarder")
    try:
        await asyncio.wait_for(forwarder.ready.wait(), timeout=20)
        yield forwarder
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


def _settings(nats_url: str, publisher: AlertStream, receiver: Receiver) -> ForwarderSettings:
    return ForwarderSettings(
        nats=ProbedNatsSettings(url=nats_url, subject_prefix=publisher.subjects.prefix),
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
            return len(receiver.hooks) >= 3 and len(receiver.am) >= 3

        await eventually(all_in, within_s=10)
    assert receiver.refused == 3
    assert [_alert_ids(h) for h in receiver.hooks] == [["a001"], ["a002"], ["a003"]]
    labels = {
        "alertname": "GpufleetEventDeviceUnhealthy", "severity": "warning", "pool": "pool-a",
        "node": "gpu-01.example.net", "device": "GPU-1", "cluster": "test",
    }  # fmt: skip
    fired = receiver.am[0]
    assert fired["labels"] == labels
    assert fired["startsAt"] == "2027-01-15T08:00:01.000Z"
    # Firing until resolved: endsAt a few resend intervals from now, not from the event.
    assert fired["endsAt"] > _now_rfc3339()
    assert fired["annotations"]["description"] == "reason 1"
    # device.healthy ends the condition that fired: same labels, endsAt at the transition.
    (resolved,) = [a for a in receiver.am if a["endsAt"] == "2027-01-15T08:00:02.000Z"]
    assert resolved["labels"] == labels
    assert resolved["startsAt"] == "2027-01-15T08:00:01.000Z"
    event = receiver.am[-1]
    assert event["labels"]["alertname"] == "GpufleetEventNodeRegistered"
    # The webhook body is Alertmanager's webhook payload.
    hook = receiver.hooks[1]
    assert hook["version"] == "4" and hook["status"] == "resolved"
    assert hook["receiver"] == "gpufleet" and hook["groupLabels"] == {
        "alertname": "GpufleetEventDeviceUnhealthy"
    }
    assert hook["groupKey"] == '{}:{alertname="GpufleetEventDeviceUnhealthy"}'
    assert hook["commonLabels"] == labels
    assert hook["commonAnnotations"]["kind"] == "device.healthy"
    assert set(hook) >= {"externalURL", "truncatedAlerts"}
    (sent,) = hook["alerts"]
    assert sent["status"] == "resolved" and sent["labels"] == labels
    assert sent["endsAt"] == "2027-01-15T08:00:02.000Z"
    assert set(sent) == {
        "status", "labels", "annotations", "startsAt", "endsAt", "generatorURL", "fingerprint"
    }  # fmt: skip
    assert receiver.hooks[0]["alerts"][0]["endsAt"] == "0001-01-01T00:00:00Z"


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

        # Nothing lost: what the first did not hand back comes back after JetStream's
        # 30 s ack wait at the latest (the hand-back itself: the SIGTERM test below).
        await eventually(caught_up, within_s=45)
    assert {i for h in receiver.hooks for i in _alert_ids(h)} == {f"a{n:03d}" for n in range(5)}
    seen = len(receiver.hooks)
    # Everything was acknowledged: a third start delivers nothing again.
    async with forwarding(settings) as third:
        await publisher.publish(_alert("node.registered", 9))

        async def the_new_one() -> bool:
            return third.delivered >= 1

        await eventually(the_new_one, within_s=10)
        await asyncio.sleep(0.3)
    assert [_alert_ids(h) for h in receiver.hooks[seen:]] == [["a009"]]


def test_the_cli_refuses_a_forwarder_without_a_target_or_with_a_bad_url(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run(["alerts", "forward"], {}) == 2
    assert "no target" in capsys.readouterr().err
    assert run(["alerts", "forward", "--webhook", "ftp://x"], {}) == 2
    assert "not an http(s) URL" in capsys.readouterr().err
    hook = "https://u:s3cret@hooks.example/x?token=t0ken"
    assert run(["alerts", "forward", "--webhook", hook, "--nats-url", "nats://a:4222,b"], {}) == 2
    err = capsys.readouterr().err
    assert "nats_url: 'b' is not a nats://host:port URL" in err
    assert run(["alerts", "forward", "--webhook", hook.replace("https", "ftp")], {}) == 2
    err = capsys.readouterr().err
    assert "not an http(s) URL" in err and "s3cret" not in err and "t0ken" not in err


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
        # Within JetStream's 30 s ack wait: nothing waits for a redelivery timer. (20 s,
        # not 10: a starved 2-core machine once took longer than 10 s to deliver five.)
        async def caught_up() -> bool:
            seen = {i for h in receiver.hooks for i in _alert_ids(h)}
            return seen == {f"a{n:03d}" for n in range(5)}

        await eventually(caught_up, within_s=20)
    finally:
        await _stop_process(second)


async def test_a_restarted_forwarder_resends_what_is_still_firing_from_the_history(
    nats_url: str, publisher: AlertStream, receiver: Receiver
) -> None:
    settings = replace(_settings(nats_url, publisher, receiver), webhooks=())
    async with forwarding(settings) as first:
        await publisher.publish(_alert("node.unreachable", 1))
        await publisher.publish(_alert("device.unhealthy", 2, device_id="GPU-1"))
        await publisher.publish(_alert("device.healthy", 3, device_id="GPU-1"))

        async def done() -> bool:
            return first.delivered >= 3

        await eventually(done, within_s=10)
    receiver.am.clear()
    # Nothing new on the stream: all the second start knows, it read from the history.
    async with forwarding(settings) as second:

        async def resent() -> bool:
            return len(receiver.am) >= 1

        await eventually(resent, within_s=10)
        assert second.delivered == 0
    names = {a["labels"]["alertname"] for a in receiver.am}
    assert names == {"GpufleetEventNodeUnreachable"}
    assert all(a["endsAt"] > _now_rfc3339() for a in receiver.am)


async def test_a_bare_timeout_from_fetch_is_an_empty_poll_not_a_crash(
    nats_url: str, publisher: AlertStream, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    # nats-py 2.16's fetch raises a bare asyncio.TimeoutError, not its own, when its
    # no-wait probe leaves too little of the wait for a lingering pull; a wait this
    # short takes that path on nearly every poll against a real server.
    settings = replace(_settings(nats_url, publisher, receiver), fetch_wait_s=0.0002)
    async with forwarding(settings) as forwarder:
        task = next(t for t in asyncio.all_tasks() if t.get_name() == "forwarder")
        await asyncio.sleep(1.0)
        assert not task.done(), task
        assert forwarder.source is not None and forwarder.source.errors == 0
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and "alerts" in r.name]


async def test_a_deleted_consumer_is_recreated_and_forwarding_resumes_where_it_was(
    nats_url: str, publisher: AlertStream, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    settings = replace(_settings(nats_url, publisher, receiver), alertmanager=())
    async with forwarding(settings) as forwarder:
        await publisher.publish(_alert("node.registered", 1))

        async def first() -> bool:
            return forwarder.delivered >= 1

        await eventually(first, within_s=10)
        # What any user with the API permission can do (issue 21: the reader could).
        js = publisher.bus.jetstream(timeout_s=5)
        assert await js.delete_consumer(publisher.name, settings.durable)
        await publisher.publish(_alert("node.registered", 2))

        async def second() -> bool:
            return forwarder.delivered >= 2

        await eventually(second, within_s=15)
        info = await js.consumer_info(publisher.name, settings.durable)
        assert info.config.durable_name == settings.durable
        await publisher.publish(_alert("node.registered", 3))

        async def third() -> bool:
            return forwarder.delivered >= 3

        await eventually(third, within_s=10)
        await asyncio.sleep(0.3)
    # Recreated from where this forwarder was, not from the stream's first message.
    assert [_alert_ids(h) for h in receiver.hooks] == [["a001"], ["a002"], ["a003"]]
    assert forwarder.source is not None and forwarder.source.recreated == 1
    assert any("recreated" in r.getMessage() for r in caplog.records)


def _durable_grants(stream: str, durable: str, *, history: bool) -> list[str]:
    """What a forwarder's own NATS user may publish (as `gpufleet nats-auth --forwarder`
    grants): its own durable consumer, and with `history` the stream by direct get."""
    grants = forwarder_permissions(stream, durable, f"forwarder:{durable}").publish
    return [g for g in grants if history or ".GET." not in g]


@pytest.mark.parametrize("history", [True, False], ids=["with-history", "without"])
async def test_a_forwarder_limited_to_its_own_durable_forwards_and_recreates_it(
    tmp_path: Path, receiver: Receiver, caplog: pytest.LogCaptureFixture, history: bool
) -> None:
    caplog.set_level(logging.INFO, logger="gpufleet.alerts")
    prefix = f"t{secrets.token_hex(4)}"
    stream = stream_name(prefix)
    users = [
        {"user": "coordinator", "password": "c"},
        {
            "user": "fwd",
            "password": "f",
            "permissions": {
                "publish": {"allow": _durable_grants(stream, "fwd", history=history)},
                "subscribe": {"allow": ["_INBOX.>"]},
            },
        },
    ]
    config = tmp_path / "nats.conf"
    config.write_text("authorization " + json.dumps({"users": users}) + "\n")
    with EmbeddedNats(config_file=str(config)) as server:
        bus = Bus(NatsSettings(url=server.url.replace("nats://", "nats://coordinator:c@")))
        await bus.connect()
        try:
            alerts = AlertStream(bus, Subjects(prefix))
            await alerts.setup()
            await alerts.publish(_alert("node.unreachable", 1))
            settings = ForwarderSettings(
                nats=ProbedNatsSettings(
                    url=server.url.replace("nats://", "nats://fwd:f@"), subject_prefix=prefix
                ),
                durable="fwd",
                alertmanager=(receiver.url,),
            )
            async with forwarding(settings) as forwarder:

                async def first() -> bool:
                    return forwarder.delivered >= 1

                await eventually(first, within_s=10)
                js = bus.jetstream(timeout_s=5)
                assert await js.delete_consumer(stream, "fwd")
                await alerts.publish(_alert("node.reachable", 2))

                async def second() -> bool:
                    return forwarder.delivered >= 2

                await eventually(second, within_s=15)
        finally:
            await bus.close()
    assert forwarder.source is not None and forwarder.source.recreated == 1
    said = [r.getMessage() for r in caplog.records if "history" in r.getMessage()]
    if history:
        assert any("after 1 alerts of history" in m for m in said), said
    else:
        assert any("going on without it" in m for m in said), said
    assert "fwd:f@" not in caplog.text


async def test_a_consumer_rewritten_behind_its_back_is_found_logged_counted_and_set_back(
    nats_url: str, publisher: AlertStream, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 32: someone rewrote the forwarder's durable (a filter matching nothing, a
    ten-year inactivity threshold); `gpufleet-alerts` then delivered none of the next
    alerts and logged nothing. Now its periodic check finds the change, says it at ERROR,
    counts it (`/metrics`) and sets the consumer back, and the next alerts are delivered."""
    settings = replace(_settings(nats_url, publisher, receiver), webhooks=(), metrics_port=0)
    async with forwarding(settings) as forwarder:
        await publisher.publish(_alert("node.registered", 1))

        async def first() -> bool:
            return len(receiver.am) >= 1

        await eventually(first, within_s=10)
        source = forwarder.source
        assert source is not None and source.mismatches == 0
        stream = publisher.name
        js = publisher.bus.jetstream(timeout_s=5)
        have = (await js.consumer_info(stream, settings.durable)).config
        nothing = f"{publisher.subjects.prefix}.alert.nothing.nothing.nothing"
        rewritten = await js.add_consumer(
            stream, have.evolve(filter_subject=nothing, inactive_threshold=10 * 365 * 86400.0)
        )
        assert rewritten.config.filter_subject == nothing
        source.check_every_s = 0.2
        with caplog.at_level(logging.ERROR, logger="gpufleet.alerts"):
            await publisher.publish(_alert("node.unreachable", 2))

            async def second() -> bool:
                return len(receiver.am) >= 2

            await eventually(second, within_s=15)
        assert source.mismatches == 1
        url = f"http://127.0.0.1:{forwarder.metrics_port}/metrics"
        async with aiohttp.ClientSession() as http, http.get(url) as resp:
            text = await resp.text()
        assert "gpufleet_alerts_consumer_mismatches_total 1.0" in text
        assert "gpufleet_alerts_delivered 2.0" in text
        errors = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert errors and "changed behind our back" in errors[0].getMessage()
        assert "filter_subject" in errors[0].getMessage()
        fixed = (await js.consumer_info(stream, settings.durable)).config
        assert fixed.filter_subject == publisher.subjects.all_alerts
        assert not fixed.inactive_threshold


async def test_a_consumer_made_a_push_consumer_stops_the_forwarder_loudly(
    nats_url: str, publisher: AlertStream, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    """A consumer under its name that cannot be set back (pushing elsewhere) is not
    used: the forwarder stops with ConsumerConflict after an ERROR, rather than forward
    nothing."""
    settings = replace(_settings(nats_url, publisher, receiver), webhooks=())
    js = publisher.bus.jetstream(timeout_s=5)
    await js.add_consumer(
        publisher.name,
        ConsumerConfig(
            name=settings.durable, durable_name=settings.durable,
            deliver_subject=f"{publisher.subjects.prefix}.bookings.elsewhere",
        ),
    )  # fmt: skip
    forwarder = AlertForwarder(settings)
    with pytest.raises(ConsumerConflict, match="cannot be updated"):
        await asyncio.wait_for(forwarder.run(), timeout=20)
    assert forwarder.source is not None and forwarder.source.mismatches == 1
    assert any(
        r.levelno == logging.ERROR and "changed behind our back" in r.getMessage()
        for r in caplog.records
    )


class Failing:
    """A target that answers 503 to everything, counting the attempts."""

    def __init__(self) -> None:
        self.attempts = 0
        self.url = ""

    @asynccontextmanager
    async def serving(self) -> AsyncIterator[Failing]:
        async def refuse(request: web.Request) -> web.Response:
            self.attempts += 1
            return web.Response(status=503, text="down for maintenance")

        app = web.Application()
        app.router.add_post("/{tail:.*}", refuse)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        try:
            yield self
        finally:
            await runner.cleanup()


async def test_a_failing_target_delays_only_itself_and_its_bounded_queue_drops(
    nats_url: str, publisher: AlertStream, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    async with Failing().serving() as down:
        settings = replace(
            _settings(nats_url, publisher, receiver),
            webhooks=(receiver.url + "/hook", down.url + "/hook"),
            max_queue=2,
            # Long enough that a target waiting on another would miss every wait below.
            backoff_initial_s=30.0,
            backoff_max_s=30.0,
        )
        async with forwarding(settings) as forwarder:
            for n in range(6):
                await publisher.publish(_alert("node.registered", n))

                # One at a time, each waited for at the healthy targets: a burst larger
                # than max_queue would fill a slow machine's healthy queues too, which is
                # the bound doing its job, not the failing target delaying the others.
                async def others_have(count: int = n + 1) -> bool:
                    return len(receiver.hooks) >= count and len(receiver.am) >= count

                await eventually(others_have, within_s=10)
            failing = forwarder.webhooks[1]
            # One alert in its hands, at most two queued; the rest dropped and counted.
            assert failing.dropped + len(failing.queue) == 5 and len(failing.queue) <= 2
            assert forwarder.dropped == failing.dropped >= 3
            # Acknowledged: every alert the failing target is done with (dropped).
            assert forwarder.delivered == failing.dropped
            assert down.attempts == 1
    assert [_alert_ids(h) for h in receiver.hooks] == [[f"a{n:03d}"] for n in range(6)]
    drops = [r for r in caplog.records if "queue full" in r.getMessage()]
    assert len(drops) == failing.dropped
    assert all(r.levelno == logging.WARNING for r in drops)


async def test_webhook_secrets_never_reach_the_log(
    nats_url: str, publisher: AlertStream, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # every level: a secret must not show in any
    receiver.failing = 2
    host = receiver.url.removeprefix("http://")
    settings = replace(
        _settings(nats_url, publisher, receiver),
        alertmanager=(f"http://am:hunter2@{host}",),
        webhooks=(f"http://ops:s3cret@{host}/hook?token=t0ken&team=ml",),
    )
    async with forwarding(settings):
        await publisher.publish(_alert("node.registered", 1))

        async def delivered() -> bool:
            return len(receiver.hooks) >= 1 and len(receiver.am) >= 1

        await eventually(delivered, within_s=10)
    assert receiver.refused == 2
    # Not the receiver's own access log (aiohttp.access: this test's stand-in for the
    # webhook's server, which is given the URL; it used to show only when an earlier
    # test in the process had left the root logger at INFO).
    records = [r for r in caplog.records if r.name != "aiohttp.access"]
    text = "".join(f"{caplog.handler.format(r)}\n" for r in records)
    assert "delivery to http://***@" in text
    for secret in ("hunter2", "s3cret", "t0ken", "ops:", "am:"):
        assert secret not in text


# A real Alertmanager (Debian's prometheus-alertmanager), read back through its API v2.
BINARY = "prometheus-alertmanager"
CONFIG = """\
route:
  receiver: nobody
receivers:
  - name: nobody
"""


def _binary() -> str:
    path = shutil.which(BINARY) or shutil.which("alertmanager")
    if path is None:
        why = "Alertmanager not installed (Debian: apt-get install prometheus-alertmanager)"
        if os.environ.get("GPUFLEET_TEST_TOOLS") == "required":
            pytest.fail(why)
        pytest.skip(why)
    return path


class Alertmanager:
    """One Alertmanager on a loopback port of its own, started and restarted on it."""

    def __init__(self, binary: str, workdir: Path) -> None:
        self.binary = binary
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        (workdir / "alertmanager.yml").write_text(CONFIG)

    def start(self) -> None:
        with open(self.workdir / "alertmanager.log", "ab") as log_file:
            self.proc = subprocess.Popen(
                [
                    self.binary,
                    f"--config.file={self.workdir / 'alertmanager.yml'}",
                    f"--storage.path={self.workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--cluster.listen-address=",
                    "--log.level=warn",
                ],
                stdout=subprocess.DEVNULL,
                stderr=log_file,
            )

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
            self.proc = None

    async def ready(self, http: aiohttp.ClientSession) -> None:
        async def up() -> bool:
            try:
                async with http.get(self.url + "/-/ready") as resp:
                    return resp.status == 200
            except aiohttp.ClientError:
                return False

        await eventually(up, within_s=20)

    async def alerts(self, http: aiohttp.ClientSession) -> list[dict[str, Any]]:
        """The alerts Alertmanager lists as active (resolved ones are not listed)."""
        async with http.get(self.url + "/api/v2/alerts") as resp:
            assert resp.status == 200
            body: list[dict[str, Any]] = await resp.json()
            return body


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[Alertmanager]:
    am = Alertmanager(_binary(), tmp_path)
    am.start()
    try:
        yield am
    finally:
        am.stop()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        yield session


async def test_a_condition_reaches_alertmanager_once_outlives_its_restart_and_resolves(
    nats_url: str,
    publisher: AlertStream,
    receiver: Receiver,
    alertmanager: Alertmanager,
    http: aiohttp.ClientSession,
) -> None:
    await alertmanager.ready(http)
    receiver.failing = -1  # the second target answers 503 throughout
    settings = ForwarderSettings(
        nats=ProbedNatsSettings(url=nats_url, subject_prefix=publisher.subjects.prefix),
        alertmanager=(alertmanager.url,),
        webhooks=(receiver.url + "/hook",),
        # The failing webhook backs off for long: had it held the others, nothing
        # would reach Alertmanager within the waits below.
        backoff_initial_s=30.0,
        backoff_max_s=30.0,
        resend_interval_s=0.5,
        labels={"cluster": "test"},
    )
    async with forwarding(settings) as forwarder:
        now = int(time.time()) * 1000
        fired = msgspec.structs.replace(_alert("device.unhealthy", 1, device_id="GPU-1"), at=now)
        await publisher.publish(fired)

        async def listed() -> bool:
            return len(await alertmanager.alerts(http)) > 0

        await eventually(listed, within_s=10)
        await asyncio.sleep(1.5)  # a few resends: still one alert
        alerts = await alertmanager.alerts(http)
        assert len(alerts) == 1, alerts
        (alert,) = alerts
        labels = {
            "alertname": "GpufleetEventDeviceUnhealthy", "severity": "warning",
            "pool": "pool-a", "node": "gpu-01.example.net", "device": "GPU-1",
            "cluster": "test",
        }  # fmt: skip
        assert alert["labels"] == labels
        assert alert["fingerprint"] == fingerprint(labels)
        assert alert["startsAt"].startswith(rfc3339(now)[:19])
        assert alert["status"]["state"] == "active"
        assert receiver.refused >= 1 and receiver.hooks == []

        alertmanager.stop()
        alertmanager.start()
        await alertmanager.ready(http)
        # Alertmanager keeps no alerts across a restart: the resend brings it back. A
        # resend that met the restart backs off first (30 s here, as for the webhook).
        await eventually(listed, within_s=settings.backoff_max_s + 15)
        assert [a["labels"] for a in await alertmanager.alerts(http)] == [labels]

        ended = _alert("device.healthy", 2, device_id="GPU-1")
        await publisher.publish(msgspec.structs.replace(ended, at=int(time.time() * 1000)))

        async def resolved() -> bool:
            return await alertmanager.alerts(http) == []

        await eventually(resolved, within_s=10)
        # Resolved stays resolved: nothing re-fires it.
        await asyncio.sleep(1.5)
        assert await alertmanager.alerts(http) == []
        assert forwarder.webhooks[0].delivered == 0


async def test_unbooked_use_stays_firing_past_the_event_ttl_and_an_alertmanager_restart(
    nats_url: str,
    publisher: AlertStream,
    alertmanager: Alertmanager,
    http: aiohttp.ClientSession,
) -> None:
    """Use is a condition (issue 34): a pod on a GPU nobody booked fires until its end,
    re-sent like the health conditions, so neither the event TTL nor an Alertmanager
    restart loses it while the pod runs; it carries its owner and the holder's tenant."""
    await alertmanager.ready(http)
    settings = ForwarderSettings(
        nats=ProbedNatsSettings(url=nats_url, subject_prefix=publisher.subjects.prefix),
        alertmanager=(alertmanager.url,), resend_interval_s=0.5, event_ttl_s=1,
        backoff_initial_s=0.2, backoff_max_s=0.5,
    )  # fmt: skip
    owners = [{"pid": 7, "owner": "ml/train-0", "ownerKind": "pod"}]
    async with forwarding(settings):
        now = int(time.time() * 1000)
        unbooked = _alert(
            "gpu.unbookedUse",
            1,
            device_id="GPU-1",
            details={"pids": [7], "owners": owners, "ends": "gpu.unbookedUseEnded"},
        )
        foreign = _alert(
            "gpu.foreignUse", 2, device_id="GPU-2",
            details={"ownerKind": "slurm", "owner": "42", "pids": [9],
                     "holders": ["rsv_1"], "holderTenantIds": ["acme"],
                     "ends": "gpu.foreignUseEnded"},
        )  # fmt: skip
        for a in (unbooked, foreign):
            await publisher.publish(msgspec.structs.replace(a, at=now))

        async def names() -> set[str]:
            return {a["labels"]["alertname"] for a in await alertmanager.alerts(http)}

        async def both() -> bool:
            return await names() == {"GpufleetEventGpuUnbookedUse", "GpufleetEventGpuForeignUse"}

        await eventually(both, within_s=10)
        await asyncio.sleep(2.5)  # past the event TTL (1 s): still firing
        assert await both()
        by_name = {a["labels"]["alertname"]: a for a in await alertmanager.alerts(http)}
        pod = by_name["GpufleetEventGpuUnbookedUse"]
        assert pod["labels"]["owner_kind"] == "pod"
        assert pod["labels"]["owner_name"] == "pod:ml/train-0"
        assert "pid 7 (pod ml/train-0)" in pod["annotations"]["description"]
        job = by_name["GpufleetEventGpuForeignUse"]
        assert (job["labels"]["owner"], job["labels"]["tenant"]) == ("slurm:42", "acme")

        alertmanager.stop()
        alertmanager.start()
        await alertmanager.ready(http)
        await eventually(both, within_s=15)  # the resend brings both back

        for n, a in enumerate((unbooked, foreign), start=3):
            end = msgspec.structs.replace(
                a, alert_id=f"a{n:03d}", kind=a.kind + "Ended", at=int(time.time() * 1000)
            )
            await publisher.publish(end)

        async def resolved() -> bool:
            return await alertmanager.alerts(http) == []

        await eventually(resolved, within_s=10)
        await asyncio.sleep(1.5)
        assert await alertmanager.alerts(http) == []
