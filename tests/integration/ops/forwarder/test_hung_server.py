"""The forwarder's NATS server hangs (SIGSTOP; TCP stays open, nothing closes): the
forwarder notices with the link probe every gpufleet process runs (`procs.nats_link`),
says so in its log, moves to another server of the cluster and delivers what was raised
meanwhile (issue 34, N1: it used to sit out nats-py's pings, 110 s, logging nothing).
Real three-server cluster, real Alertmanager API receiver over HTTP."""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
import time

import aiohttp
import nats.errors
import pytest

from coordinator.bus.alerts import AlertNotStored, AlertStream
from coordinator.bus.connection import Bus
from ops.forwarder.settings import ForwarderSettings
from ops.kit.embedded_nats import EmbeddedNatsCluster
from procs.nats import NatsSettings, ProbedNatsSettings
from shared.subjects import Subjects
from shared.wire import Alert
from tests.integration.ops.forwarder.test_alert_forwarder import Receiver, _alert, forwarding
from tests.waiting import eventually

# Probe every 1 s, 2 s to answer (the defaults): the link is taken as dead in about 3 s,
# within a third of the default detection window. An alert the consumer handed to the
# forwarder through the hung server just then is lost on the way and comes again after
# the ack wait (`http_timeout_s` + 5 s, 15 s by default), and JetStream may first elect
# new leaders for the stream and the consumer (nats-server's raft: 4 to 9 s): 25 s
# covers either, against 110 s before (issue 34).
NOTICE_S = 5.0
BOUND_S = 25.0


# nats-py's force_reconnect leaves the hung link's StreamWriter to the garbage collector
# (closing, never awaited): its ResourceWarning is nats-py's, not a leak of ours.
pytestmark = [
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]


async def _publish(stream: AlertStream, alert: Alert) -> None:
    """Publish as the coordinator does, again while the stream elects a new leader (its
    old one may be on the hung server): the coordinator keeps an alert until stored."""
    deadline = time.monotonic() + 30
    while True:
        try:
            await stream.publish(alert)
            return
        except AlertNotStored:
            if time.monotonic() > deadline:
                raise


def _metric(text: str, name: str, labels: str = "") -> float:
    pattern = rf"^{re.escape(name)}{re.escape(labels)} (\S+)$"
    found = re.search(pattern, text, re.M)
    assert found is not None, f"{name}{labels} not in /metrics:\n{text}"
    return float(found.group(1))


async def test_a_hung_server_under_the_forwarder_delays_an_alert_by_seconds_not_minutes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    cluster = EmbeddedNatsCluster(3)
    await asyncio.to_thread(cluster.start)
    hung = cluster.servers["n1"]
    others = [s.url for name, s in cluster.servers.items() if name != "n1"]
    paused = False
    bus = Bus(NatsSettings(url=",".join(others)), probe_timeout_s=2.0)
    try:
        await bus.connect()
        stream = AlertStream(bus, Subjects(f"t{secrets.token_hex(4)}"))
        # A new cluster elects its JetStream leader first: until then setup times out.
        deadline = time.monotonic() + 30
        while True:
            try:
                await stream.setup()
                break
            except nats.errors.Error:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)
        async with Receiver().serving() as receiver:
            # Given only n1, the forwarder starts there (and learns the others from it).
            settings = ForwarderSettings(
                nats=ProbedNatsSettings(url=hung.url, subject_prefix=stream.subjects.prefix),
                alertmanager=(receiver.url,),
                backoff_initial_s=0.05,
                metrics_port=0,
            )
            assert settings.nats.probe_interval_s + settings.nats.probe_timeout_s <= 3.0
            async with forwarding(settings) as forwarder, aiohttp.ClientSession() as http:
                await stream.publish(_alert("node.registered", 1))

                async def first() -> bool:
                    return len(receiver.am) >= 1

                await eventually(first, within_s=10)
                assert forwarder.nc is not None
                assert forwarder.nc.connected_url is not None
                assert forwarder.nc.connected_url.port == hung.port

                hung.pause()
                paused = True
                paused_at, paused_wall = time.monotonic(), time.time()
                await _publish(stream, _alert("node.maintenance", 2))

                async def arrived() -> bool:
                    return any(a["annotations"].get("alertId") == "a002" for a in receiver.am)

                await eventually(arrived, within_s=BOUND_S)
                took = time.monotonic() - paused_at

                async def noticed_it() -> bool:
                    return forwarder.link.failures >= 1

                await eventually(noticed_it, within_s=NOTICE_S)

                async def on_another_server() -> bool:
                    # Checked as a state reached, not at one instant: on a loaded machine
                    # the new link may itself be reconnecting (no connected URL) right then.
                    url = forwarder.nc.connected_url if forwarder.nc else None
                    return url is not None and url.port != hung.port

                await eventually(on_another_server, within_s=NOTICE_S)
                noticed = [
                    r.created - paused_wall
                    for r in caplog.records
                    if "link taken as dead" in r.getMessage() and f":{hung.port}" in r.getMessage()
                ]
                assert noticed, [r.getMessage() for r in caplog.records]
                assert noticed[0] <= NOTICE_S, noticed
                assert any("reconnected to NATS at" in r.getMessage() for r in caplog.records)

                url_m = f"http://127.0.0.1:{forwarder.metrics_port}/metrics"
                async with http.get(url_m) as resp:
                    text = await resp.text()
                target = f'{{target="{receiver.url}"}}'
                assert _metric(text, "gpufleet_alerts_nats_link_failures") >= 1
                assert _metric(text, "gpufleet_alerts_nats_up") == 1
                assert _metric(text, "gpufleet_alerts_delivered") == 2
                assert _metric(text, "gpufleet_alerts_target_delivered", target) == 2
                assert _metric(text, "gpufleet_alerts_target_up", target) == 1
                assert _metric(text, "gpufleet_alerts_target_queue", target) == 0
                assert _metric(text, "gpufleet_alerts_target_dropped", target) == 0
                assert _metric(text, "gpufleet_alerts_queued") == 0
                print(f"noticed after {noticed[0]:.1f} s, delivered after {took:.1f} s")
    finally:
        if paused:
            hung.resume()
        await bus.close()
        await asyncio.to_thread(cluster.close)
