"""A real nats-server running the configuration `gpufleet nats-auth` writes: each agent
speaks only for itself, the coordinator works within its permissions, and an alerts
reader can read the alert stream but not write to it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from agent.config import Settings
from agent.main import run as run_agent
from coordinator.app import running_coordinator
from coordinator.bus.alerts import stream_name
from coordinator.bus.connection import Bus
from ops.embedded_nats import EmbeddedNats, find_nats_server, free_port
from ops.nats_auth import (
    AgentNode,
    AuthBundle,
    agent_user,
    bcrypt_hasher,
    build,
    reader_user,
    write_bundle,
)
from shared.ids import new_pool_id
from shared.subjects import Subjects
from shared.wire import Alert, Heartbeat
from tests.integration.conftest import Api, coordinator_settings
from tests.waiting import eventually

PREFIX = "tsec"
SUBJECTS = Subjects(PREFIX)
POOL = new_pool_id()
NODE_A = AgentNode(POOL, "gpu-a.rack1")  # a dot: encoded as %2E in its subjects
NODE_B = AgentNode(POOL, "gpu-b")


@dataclass
class Secured:
    server: EmbeddedNats
    bundle: AuthBundle
    creds: Path

    def creds_file(self, user: str) -> Path:
        return self.creds / next(u for u in self.bundle.users if u.name == user).creds_filename

    async def connect(self, user: str, errors: list[str] | None = None) -> Client:
        async def on_error(exc: Exception) -> None:
            if errors is not None:
                errors.append(str(exc))

        return await nats.connect(
            self.server.url,
            user=user,
            password=self.bundle.passwords[user],
            error_cb=on_error,
            allow_reconnect=False,
        )


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    out = tmp_path_factory.mktemp("nats-auth")
    bundle = build(
        [NODE_A, NODE_B],
        alert_stream=stream_name(PREFIX),
        prefix=PREFIX,
        readers=["monitoring"],
        hash_password=bcrypt_hasher(4),  # real bcrypt, as nats-server must check it
        store_dir=None,  # EmbeddedNats passes its own
    )
    write_bundle(out, bundle)
    with EmbeddedNats(config_file=str(out / "nats-server.conf")) as server:
        yield Secured(server, bundle, out / "creds")


def denied(errors: list[str], what: str) -> set[str]:
    """Subjects the server refused, from the client's error callback (which lower-cases
    the server's message, subject included)."""
    found = set()
    for error in errors:
        m = re.search(rf'permissions violation for {what} to "([^"]+)"', error, re.IGNORECASE)
        if m:
            found.add(m.group(1))
    return found


def lower(*subjects: str) -> set[str]:
    return {s.lower() for s in subjects}


class Collector:
    def __init__(self) -> None:
        self.subjects: list[str] = []

    async def add(self, msg: Msg) -> None:
        self.subjects.append(msg.subject)


async def test_only_known_users_with_their_password_get_in(secured: Secured) -> None:
    for user, password in ((agent_user(NODE_A), "wrong"), ("nobody", "x"), (None, None)):
        nc = Client()
        try:
            with pytest.raises(nats.errors.Error):
                await nc.connect(
                    secured.server.url,
                    user=user,
                    password=password,
                    allow_reconnect=False,
                    max_reconnect_attempts=0,
                    connect_timeout=2,
                )
        finally:
            # A refused connect leaves its socket to the caller.
            await nc.close()
    ok = await secured.connect(agent_user(NODE_A))
    assert ok.is_connected
    await ok.close()


async def test_an_agent_cannot_publish_or_listen_as_another_node(secured: Secured) -> None:
    coordinator = await secured.connect("coordinator")
    a_errors: list[str] = []
    a = await secured.connect(agent_user(NODE_A), a_errors)
    try:
        seen = Collector()
        await coordinator.subscribe(f"{PREFIX}.hb.>", cb=seen.add)
        await coordinator.subscribe(f"{PREFIX}.inv.>", cb=seen.add)
        await coordinator.flush()

        # A forges B's heartbeat and inventory, then sends its own. One connection's
        # messages arrive in order, so once A's own is in, B's would be too.
        await a.publish(SUBJECTS.heartbeat(POOL, NODE_B.node_id), b"forged")
        await a.publish(SUBJECTS.inventory(POOL, NODE_B.node_id), b"forged")
        await a.publish(SUBJECTS.heartbeat(POOL, NODE_A.node_id), b"own")
        await a.flush()

        own = SUBJECTS.heartbeat(POOL, NODE_A.node_id)

        async def own_arrived() -> bool:
            if own not in seen.subjects:
                # The server answers each forgery with an error; on a loaded machine the
                # client may be reconnecting when its own heartbeat goes out: send it again.
                with contextlib.suppress(nats.errors.Error):
                    await a.publish(own, b"own")
                    await a.flush(timeout=2)
            return own in seen.subjects

        await eventually(own_arrived)
        assert set(seen.subjects) == {f"{PREFIX}.hb.{POOL}.gpu-a%2Erack1"}
        assert denied(a_errors, "publish") == lower(
            SUBJECTS.heartbeat(POOL, NODE_B.node_id), SUBJECTS.inventory(POOL, NODE_B.node_id)
        )

        # A cannot hear B's inventory requests, nor other agents' heartbeats.
        heard = Collector()
        await a.subscribe(SUBJECTS.inventory_request(POOL, NODE_B.node_id), cb=heard.add)
        await a.subscribe(f"{PREFIX}.hb.>", cb=heard.add)
        await a.subscribe(SUBJECTS.inventory_request(POOL, NODE_A.node_id), cb=heard.add)
        await a.flush()
        await coordinator.publish(SUBJECTS.inventory_request(POOL, NODE_B.node_id), b"{}")
        await coordinator.publish(SUBJECTS.heartbeat(POOL, NODE_B.node_id), b"x")
        await coordinator.publish(SUBJECTS.inventory_request(POOL, NODE_A.node_id), b"{}")
        await coordinator.flush()

        own_request = SUBJECTS.inventory_request(POOL, NODE_A.node_id)

        async def own_request_arrived() -> bool:
            if not heard.subjects:
                # As above: the server answers each refused subscription with an error,
                # and on a loaded machine A may be reconnecting when its request goes out.
                await coordinator.publish(own_request, b"{}")
                await coordinator.flush()
            return bool(heard.subjects)

        await eventually(own_request_arrived)
        assert set(heard.subjects) == {own_request}
        assert denied(a_errors, "subscription") == lower(
            SUBJECTS.inventory_request(POOL, NODE_B.node_id), f"{PREFIX}.hb.>"
        )
    finally:
        await a.close()
        await coordinator.close()


async def test_a_real_agent_with_its_credentials_reaches_the_coordinator_and_a_reader_reads_alerts(
    secured: Secured, tmp_path: Path
) -> None:
    """The real coordinator (its own NATS user: JetStream stream, queue subscriptions)
    hears a real agent that connects with the credentials file; an operator act makes
    an alert that the monitoring user reads from the stream, which it cannot write."""
    settings = coordinator_settings(
        f"sqlite:///{tmp_path / 'ledger.db'}",
        secured.server.url,
        nats_credentials=str(secured.creds_file("coordinator")),
        subject_prefix=PREFIX,
        insecure_bus=False,  # the server demands credentials: no flag needed
    )
    reader_errors: list[str] = []
    reader = await secured.connect(reader_user("monitoring"), reader_errors)
    stop = asyncio.Event()
    agent_task: asyncio.Task[int] | None = None
    try:
        async with running_coordinator(settings) as c:
            now = int(time.time() * 1000)
            await c.ledger.tenants.create("acme", "Acme", now)
            await c.ledger.pools.create(POOL, "secured", "acme", None, now)
            live = Collector()
            await reader.subscribe(SUBJECTS.all_alerts, cb=live.add)
            await reader.flush()

            agent = Settings(
                pool_id=POOL,
                node_id=NODE_A.node_id,
                nats_url=secured.server.url,
                nats_credentials=secured.creds_file(agent_user(NODE_A)),
                subject_prefix=PREFIX,
                simulate="l40s-pcie-4",
                # Judged by its own 3 x 1 s window from its first heartbeat (no fleet-wide
                # start-up grace any more): 0.2 s would flap on a loaded test box.
                interval_s=1.0,
            )
            agent_task = asyncio.create_task(run_agent(agent, stop, install_signals=False))
            key = settings.bootstrap_operator_key
            assert key
            async with aiohttp.ClientSession() as session:
                api = Api(session, c.url, key)
                body = {"nodeId": NODE_A.node_id, "maintenance": True, "reason": "auth test"}

                async def maintenance_accepted() -> bool:
                    # 404 until the coordinator has the agent's inventory.
                    status, _ = await api.call("nodes.setMaintenance", body)
                    return status == 200

                await eventually(maintenance_accepted, within_s=20)

            js = reader.jetstream(timeout=5)
            stream = stream_name(PREFIX)
            # A durable consumer, as docs/operator.md shows monitoring systems.
            sub = await js.pull_subscribe(SUBJECTS.all_alerts, durable="pager", stream=stream)
            # The node's registration came first, then the operator's act.
            # Published from the outbox just after the commit: fetch until both are in.
            msgs = await sub.fetch(2, timeout=5)
            while len(msgs) < 2:
                msgs += await sub.fetch(2 - len(msgs), timeout=5)
            alerts = [Alert.from_json(m.data) for m in msgs]
            assert [(a.kind, a.node_id) for a in alerts] == [
                ("node.registered", NODE_A.node_id),
                ("node.maintenance", NODE_A.node_id),
            ]
            for m in msgs:
                await m.ack()

            async def live_alert_arrived() -> bool:
                return bool(live.subjects)

            await eventually(live_alert_arrived)
            before = (await js.stream_info(stream)).state.messages
            # The reader may neither forge alerts nor manage the stream.
            forged = SUBJECTS.alert(POOL, NODE_A.node_id, "node.healthy")
            await reader.publish(forged, b"{}")
            await reader.flush()
            with pytest.raises(nats.errors.Error):
                await js.delete_stream(stream)
            assert (await js.stream_info(stream)).state.messages == before
            assert denied(reader_errors, "publish") == lower(
                forged, f"$JS.API.STREAM.DELETE.{stream}"
            )

            # And the agent's own heartbeats keep arriving through the coordinator's user.
            heard: list[Heartbeat] = []

            async def on_hb(msg: Msg) -> None:
                heard.append(Heartbeat.from_json(msg.data))

            coordinator_view = await secured.connect("coordinator")
            try:
                await coordinator_view.subscribe(SUBJECTS.all_heartbeats, cb=on_hb)

                async def heartbeat_seen() -> bool:
                    return bool(heard)

                await eventually(heartbeat_seen)
                assert heard[0].node_id == NODE_A.node_id
            finally:
                await coordinator_view.close()
    finally:
        stop.set()
        if agent_task is not None:
            assert await asyncio.wait_for(agent_task, 15) == 0
        await reader.close()


async def test_a_reload_cuts_off_only_the_rotated_user(tmp_path: Path) -> None:
    """The flow docs/operator.md describes: regenerate with one node rotated and one
    added, `nats-server --signal reload` (SIGHUP): the rotated agent is disconnected
    and its old password refused, the untouched one stays connected, the new one gets in."""
    first = build(
        [NODE_A, NODE_B],
        alert_stream=stream_name(PREFIX),
        prefix=PREFIX,
        hash_password=bcrypt_hasher(4),
        store_dir=str(tmp_path / "js"),
    )
    write_bundle(tmp_path, first)
    port = free_port()
    server = await asyncio.create_subprocess_exec(
        find_nats_server(),
        "-c", str(tmp_path / "nats-server.conf"),
        "-a", "127.0.0.1",
        "-p", str(port),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    url = f"nats://127.0.0.1:{port}"
    clients: list[Client] = []
    try:
        lost: list[str] = []

        async def login(node: AgentNode, password: str) -> Client:
            async def on_disconnect() -> None:
                lost.append(node.node_id)

            nc = Client()
            clients.append(nc)
            await nc.connect(
                url,
                user=agent_user(node),
                password=password,
                disconnected_cb=on_disconnect,
                allow_reconnect=False,
                max_reconnect_attempts=0,
                connect_timeout=2,
            )
            return nc

        for _ in range(100):  # the server needs a moment to listen
            try:
                a = await login(NODE_A, first.passwords[agent_user(NODE_A)])
                break
            except (OSError, nats.errors.Error):
                await asyncio.sleep(0.05)
        else:
            raise AssertionError("nats-server did not let the agent in")
        b = await login(NODE_B, first.passwords[agent_user(NODE_B)])
        node_c = AgentNode(POOL, "gpu-c")
        second = build(
            [NODE_A, NODE_B, node_c],
            alert_stream=stream_name(PREFIX),
            prefix=PREFIX,
            passwords=first.passwords,
            rotate=[agent_user(NODE_A)],
            hash_password=bcrypt_hasher(4),
            store_dir=str(tmp_path / "js"),
        )
        write_bundle(tmp_path, second)
        server.send_signal(signal.SIGHUP)

        async def a_cut_off() -> bool:
            return not a.is_connected

        await eventually(a_cut_off)
        assert lost == [NODE_A.node_id] and b.is_connected
        with pytest.raises(nats.errors.Error):
            await login(NODE_A, first.passwords[agent_user(NODE_A)])
        assert (await login(NODE_A, second.passwords[agent_user(NODE_A)])).is_connected
        assert (await login(node_c, second.passwords[agent_user(node_c)])).is_connected
        assert b.is_connected
    finally:
        for nc in clients:
            await nc.close()
        server.terminate()
        await asyncio.wait_for(server.wait(), 10)


async def test_a_permissions_violation_is_counted_and_logged_at_warning(
    secured: Secured, caplog: pytest.LogCaptureFixture
) -> None:
    bus = Bus(
        secured.server.url, user_credentials=str(secured.creds_file(reader_user("monitoring")))
    )
    await bus.connect(attempts=1)
    try:
        with caplog.at_level(logging.WARNING, logger="coordinator.bus.connection"):
            await bus.publish(SUBJECTS.heartbeat(POOL, "gpu-b"), b"{}")  # a reader may not
            await bus.flush()

            async def counted() -> bool:
                return bus.errors.get("permissions", 0) == 1

            await eventually(counted, within_s=5)
        assert "NATS client error (permissions)" in caplog.text
        assert "permissions violation" in caplog.text.lower()
    finally:
        await bus.close()
