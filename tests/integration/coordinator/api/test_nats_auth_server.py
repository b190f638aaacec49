"""A real nats-server running the configuration `gpufleet nats-auth` writes: each agent
speaks only for itself, the coordinator works within its permissions, and an alerts
reader can read the alert stream but not write to it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import secrets
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from agent.config import Settings
from agent.main import run as run_agent
from coordinator.app import running_coordinator
from coordinator.bus.alerts import AlertStream
from coordinator.bus.connection import Bus
from coordinator.services.node_records import record_inventory
from ops.kit.embedded_nats import EmbeddedNats, EmbeddedNatsCluster, find_nats_server, free_port
from ops.kit.nats_bundle import AuthBundle, build, write_bundle
from ops.kit.nats_users import AgentNode, agent_user, bcrypt_hasher, forwarder_user, reader_user
from ops.kit.stream_reader import read_stream
from ops.main import run as cli_run
from procs.nats import NatsSettings, read_identity
from shared.ids import new_pool_id
from shared.streams import stream_name
from shared.subjects import Subjects
from shared.wire import Alert, Heartbeat
from tests.factories import make_inventory
from tests.integration.conftest import Api, coordinator_settings
from tests.waiting import eventually

PREFIX = "tsec"
SUBJECTS = Subjects(PREFIX)
POOL = new_pool_id()
NODE_A = AgentNode(POOL, "gpu-a.rack1")  # a dot: encoded as %2E in its subjects
NODE_B = AgentNode(POOL, "gpu-b")
STREAM = stream_name(PREFIX)
FORWARDER = "alert-forwarder"
BRIDGE = "slurm-bridge"  # the Slurm bridge's consumer, as docs/operator.md names it


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

        # As every gpufleet process connects: with the options its credentials file gives.
        return await nats.connect(
            self.server.url,
            **read_identity(str(self.creds_file(user))).nats_py(),
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
        forwarders=[FORWARDER, BRIDGE],
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


def all_seen(
    errors: list[str], publishes: set[str], subscriptions: set[str]
) -> Callable[[], Awaitable[bool]]:
    """Until every expected refusal has reached the error callback: each comes on its
    own schedule, so comparing before they are all in could see a partial set (as one
    CI run did); comparing after they are, sees any refusal too many."""

    async def seen() -> bool:
        return (
            denied(errors, "publish") >= publishes
            and denied(errors, "subscription") >= subscriptions
        )

    return seen


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
                nats=NatsSettings(
                    url=secured.server.url,
                    credentials=str(secured.creds_file(agent_user(NODE_A))),
                    subject_prefix=PREFIX,
                ),
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
                await api.maintenance_once_registered(NODE_A.node_id, "auth test")

            js = reader.jetstream(timeout=5)
            stream = stream_name(PREFIX)
            # By direct get, as docs/operator.md shows monitoring systems (no consumer).
            # Published from the outbox just after the commit: read until both are in.

            alerts: list[Alert] = []

            async def both_stored() -> bool:
                alerts[:] = [
                    Alert.from_json(m.data) async for m in read_stream(reader, stream, ">")
                ]
                return len(alerts) >= 2

            await eventually(both_stored)
            assert [(a.kind, a.node_id) for a in alerts] == [
                ("node.registered", NODE_A.node_id),
                ("node.maintenance", NODE_A.node_id),
            ]

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


async def test_the_console_alert_feed_fills_under_the_coordinators_own_user(
    secured: Secured, tmp_path: Path
) -> None:
    """The console's live feed is the coordinator's subscription to `<prefix>.alert.>`:
    under the generated permissions nats-server refused it ("Subscription Violation"),
    and `/api/console/alerts` stayed empty after every alert."""
    settings = coordinator_settings(
        f"sqlite:///{tmp_path / 'ledger.db'}",
        secured.server.url,
        nats_credentials=str(secured.creds_file("coordinator")),
        subject_prefix=PREFIX,
        insecure_bus=False,
    )
    async with running_coordinator(settings) as c, aiohttp.ClientSession() as session:
        now = int(time.time() * 1000)
        await c.ledger.tenants.create("acme", "Acme", now)
        await c.ledger.pools.create(POOL, "secured", "acme", None, now)
        await record_inventory(c.ledger, make_inventory(NODE_B.node_id, POOL), now)
        key = settings.bootstrap_operator_key
        assert key
        api = Api(session, c.url, key)
        body = {"nodeId": NODE_B.node_id, "maintenance": True, "reason": "feed test"}
        await api.ok("nodes.setMaintenance", body)

        async def feed() -> list[tuple[str, str]]:
            headers = {"Authorization": f"Bearer {key}"}
            async with session.get(f"{c.url}/api/console/alerts", headers=headers) as resp:
                assert resp.status == 200
                alerts = (await resp.json())["alerts"]
            return [(a["kind"], a["nodeId"]) for a in alerts]

        async def maintenance_in_feed() -> bool:
            return ("node.maintenance", NODE_B.node_id) in await feed()

        await eventually(maintenance_in_feed, within_s=20)


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
        NatsSettings(
            url=secured.server.url, credentials=str(secured.creds_file(reader_user("monitoring")))
        )
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


@pytest.fixture
async def alert_id(secured: Secured) -> AsyncIterator[str]:
    """One alert in the stream, published as the coordinator publishes them."""
    bus = Bus(
        NatsSettings(url=secured.server.url, credentials=str(secured.creds_file("coordinator")))
    )
    await bus.connect(attempts=1)
    try:
        stream = AlertStream(bus, SUBJECTS)
        await stream.setup()
        alert = Alert(
            alert_id=f"a-{secrets.token_hex(6)}",
            kind="node.degraded",
            pool_id=POOL,
            node_id=NODE_A.node_id,
            at=int(time.time() * 1000),
        )
        await stream.publish(alert)
        yield alert.alert_id
    finally:
        await bus.close()


async def consumers(secured: Secured) -> dict[str, ConsumerConfig]:
    admin = await secured.connect("coordinator")
    try:
        infos = await admin.jetstream(timeout=5).consumers_info(STREAM)
        return {c.name: c.config for c in infos}
    finally:
        await admin.close()


async def refused_request(nc: Client, subject: str, body: dict[str, object]) -> None:
    """A request nats-server refuses to pass on: no answer (the error comes to the
    client's error callback, which the test reads afterwards)."""
    with pytest.raises(nats.errors.TimeoutError):
        await nc.request(subject, json.dumps(body).encode(), timeout=1)


def create_body(name: str | None, **config: object) -> dict[str, object]:
    return {"stream_name": STREAM, "config": ({"name": name} if name else {}) | config}


TEN_YEARS_NS = 10 * 365 * 86400 * 10**9
NOTHING = f"{PREFIX}.alert.nothing.nothing.nothing"


async def test_a_reader_reads_alerts_without_any_consumer_and_every_attack_is_refused(
    secured: Secured, alert_id: str
) -> None:
    """Issue 32: as `reader:monitoring`, the legacy create subject with `config.name`
    rewrote the forwarder's durable (it then forwarded nothing); the same route made a
    consumer under a forwarder's name before it existed, a push consumer delivering onto
    an agent's bookings subject, and `_INBOX.>` read every reply in the account. Now a
    reader reads the stream by direct get and live alerts on core NATS, and each of
    those is refused, the forwarder's consumer left as it was."""
    errors: list[str] = []
    reader = await secured.connect(reader_user("monitoring"), errors)
    forwarder = await secured.connect(forwarder_user(FORWARDER))
    agent = await secured.connect(agent_user(NODE_A))
    try:
        # What a reader may do: the history by direct get, one message by sequence.
        stored = [m async for m in read_stream(reader, STREAM, SUBJECTS.all_alerts)]
        found = [m for m in stored if Alert.from_json(m.data).alert_id == alert_id]
        assert found
        one = await reader.jetstream(timeout=5).get_msg(STREAM, found[0].seq)
        assert one.data == found[0].data

        # The forwarder's durable, made by its own user as gpufleet-alerts makes it.
        own = ConsumerConfig(
            name=FORWARDER, durable_name=FORWARDER, ack_policy=AckPolicy.EXPLICIT,
            filter_subject=SUBJECTS.all_alerts, ack_wait=30,
        )  # fmt: skip
        await forwarder.jetstream(timeout=5).add_consumer(STREAM, own)
        before = (await consumers(secured))[FORWARDER]
        bookings = SUBJECTS.bookings(POOL, NODE_A.node_id)
        heard = Collector()
        await agent.subscribe(bookings, cb=heard.add)
        await agent.flush()

        legacy = f"$JS.API.CONSUMER.CREATE.{STREAM}"
        # The reproduction: rewrite the forwarder's durable by `config.name`.
        rewrite = create_body(FORWARDER, filter_subject=NOTHING, ack_policy="explicit")
        await refused_request(reader, legacy, rewrite)
        await refused_request(reader, f"{legacy}.{FORWARDER}", rewrite)
        await refused_request(reader, f"{legacy}.{FORWARDER}.{NOTHING}", rewrite)
        # A consumer under another forwarder's name before it exists, kept ten years.
        squat = create_body("slurm-bridge", durable_name="slurm-bridge",
                            inactive_threshold=TEN_YEARS_NS)  # fmt: skip
        await refused_request(reader, legacy, squat)
        await refused_request(reader, f"{legacy}.slurm-bridge", squat)
        await refused_request(
            reader, f"$JS.API.CONSUMER.DURABLE.CREATE.{STREAM}.slurm-bridge", squat
        )
        # A push consumer delivering the alert stream onto agent A's bookings subject.
        push = create_body(None, deliver_subject=bookings, deliver_policy="all")
        await refused_request(reader, legacy, push)
        await refused_request(reader, f"{legacy}.pusher", create_body("pusher", **push["config"]))  # type: ignore[arg-type]
        # Reading, pulling, acknowledging and deleting the forwarder's.
        await refused_request(reader, f"$JS.API.CONSUMER.INFO.{STREAM}.{FORWARDER}", {})
        await refused_request(reader, f"$JS.API.CONSUMER.MSG.NEXT.{STREAM}.{FORWARDER}",
                              {"batch": 1})  # fmt: skip
        await refused_request(reader, f"$JS.API.CONSUMER.DELETE.{STREAM}.{FORWARDER}", {})
        await refused_request(reader, f"$JS.API.CONSUMER.NAMES.{STREAM}", {})
        # Every reply in the account, and the forwarder's replies.
        await reader.subscribe("_INBOX.>")
        await reader.subscribe("_INBOX_forwarder:alert-forwarder.>")
        await reader.flush()

        publishes = lower(
            legacy,
            f"{legacy}.{FORWARDER}",
            f"{legacy}.{FORWARDER}.{NOTHING}",
            f"{legacy}.slurm-bridge",
            f"$JS.API.CONSUMER.DURABLE.CREATE.{STREAM}.slurm-bridge",
            f"{legacy}.pusher",
            f"$JS.API.CONSUMER.INFO.{STREAM}.{FORWARDER}",
            f"$JS.API.CONSUMER.MSG.NEXT.{STREAM}.{FORWARDER}",
            f"$JS.API.CONSUMER.DELETE.{STREAM}.{FORWARDER}",
            f"$JS.API.CONSUMER.NAMES.{STREAM}",
        )
        subscriptions = lower("_INBOX.>", "_INBOX_forwarder:alert-forwarder.>")
        await eventually(all_seen(errors, publishes, subscriptions))
        assert denied(errors, "publish") == publishes
        assert denied(errors, "subscription") == subscriptions
        after = await consumers(secured)
        assert after[FORWARDER] == before
        assert not {"slurm-bridge", "pusher"} & set(after)
        assert heard.subjects == []
    finally:
        await agent.close()
        await forwarder.close()
        await reader.close()


async def test_a_forwarder_user_uses_the_consumer_named_after_it_and_no_other(
    secured: Secured, alert_id: str
) -> None:
    """`forwarder:<durable>` creates, updates, reads, pulls and acknowledges its own
    durable, and creates it again after someone deleted it; as the Slurm bridge's user
    it may neither rewrite, read nor pull another forwarder's, by any create subject,
    nor delete any consumer, nor read others' replies."""
    errors: list[str] = []
    bridge = await secured.connect(forwarder_user(BRIDGE), errors)
    forwarder = await secured.connect(forwarder_user(FORWARDER))
    admin = await secured.connect("coordinator")
    try:
        js = bridge.jetstream(timeout=5)
        config = ConsumerConfig(
            name=BRIDGE, durable_name=BRIDGE, ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL, filter_subject=SUBJECTS.all_alerts,
        )  # fmt: skip
        for _ in range(2):
            await js.add_consumer(STREAM, config)
            sub = await js.pull_subscribe_bind(BRIDGE, STREAM)
            for _ in range(1000):
                msgs = await sub.fetch(10, timeout=5)
                for msg in msgs:
                    await msg.ack()
                if any(Alert.from_json(m.data).alert_id == alert_id for m in msgs):
                    break
            else:
                raise AssertionError(f"alert {alert_id} not read")
            await sub.unsubscribe()
            await admin.jetstream(timeout=5).delete_consumer(STREAM, BRIDGE)
        # Updating its own: allowed (the forwarder sets back a changed consumer so).
        await js.add_consumer(STREAM, config)
        updated = await js.add_consumer(STREAM, config.evolve(max_ack_pending=77))
        assert updated.config.max_ack_pending == 77
        assert (await js.consumer_info(STREAM, BRIDGE)).config.max_ack_pending == 77

        await forwarder.jetstream(timeout=5).add_consumer(
            STREAM,
            ConsumerConfig(
                name=FORWARDER, durable_name=FORWARDER, filter_subject=SUBJECTS.all_alerts
            ),
        )
        before = (await consumers(secured))[FORWARDER]
        legacy = f"$JS.API.CONSUMER.CREATE.{STREAM}"
        rewrite = create_body(FORWARDER, filter_subject=NOTHING, ack_policy="explicit")
        await refused_request(bridge, legacy, rewrite)
        await refused_request(bridge, f"{legacy}.{FORWARDER}", rewrite)
        await refused_request(bridge, f"{legacy}.{FORWARDER}.{NOTHING}", rewrite)
        await refused_request(
            bridge, f"$JS.API.CONSUMER.DURABLE.CREATE.{STREAM}.{FORWARDER}", rewrite
        )
        await refused_request(bridge, legacy, create_body(None))  # no unnamed ones either
        await refused_request(bridge, f"$JS.API.CONSUMER.INFO.{STREAM}.{FORWARDER}", {})
        await refused_request(bridge, f"$JS.API.CONSUMER.MSG.NEXT.{STREAM}.{FORWARDER}",
                              {"batch": 1})  # fmt: skip
        await refused_request(bridge, f"$JS.API.CONSUMER.DELETE.{STREAM}.{FORWARDER}", {})
        await refused_request(bridge, f"$JS.API.CONSUMER.DELETE.{STREAM}.{BRIDGE}", {})
        await bridge.subscribe("_INBOX.>")
        await bridge.flush()

        publishes = lower(
            legacy,
            f"{legacy}.{FORWARDER}",
            f"{legacy}.{FORWARDER}.{NOTHING}",
            f"$JS.API.CONSUMER.DURABLE.CREATE.{STREAM}.{FORWARDER}",
            f"$JS.API.CONSUMER.INFO.{STREAM}.{FORWARDER}",
            f"$JS.API.CONSUMER.MSG.NEXT.{STREAM}.{FORWARDER}",
            f"$JS.API.CONSUMER.DELETE.{STREAM}.{FORWARDER}",
            f"$JS.API.CONSUMER.DELETE.{STREAM}.{BRIDGE}",
        )
        subscriptions = lower("_INBOX.>")
        await eventually(all_seen(errors, publishes, subscriptions))
        assert denied(errors, "publish") == publishes
        assert denied(errors, "subscription") == subscriptions
        assert (await consumers(secured))[FORWARDER] == before
    finally:
        await admin.jetstream(timeout=5).delete_consumer(STREAM, BRIDGE)
        await admin.close()
        await forwarder.close()
        await bridge.close()


async def test_the_written_cluster_configs_form_a_jetstream_cluster(tmp_path: Path) -> None:
    """`gpufleet nats-auth --cluster --server ...` as docs/operator.md runs it; three
    nats-servers started from those files alone (`-c`) form one JetStream cluster, in
    which the coordinator's user keeps the alert stream in three copies."""
    out = tmp_path / "auth"
    ports = {name: (free_port(), free_port()) for name in ("n1", "n2", "n3")}
    servers = [
        arg
        for name, (client, route) in ports.items()
        for arg in ("--server", f"{name}=127.0.0.1:{client},127.0.0.1:{route}")
    ]
    argv = ["nats-auth", "--out", str(out), "--bcrypt-cost", "4", "--subject-prefix", PREFIX]
    argv += ["--node", f"{POOL}:{NODE_A.node_id}", "--cluster", "fleet"]
    assert cli_run([*argv, "--store-dir", str(tmp_path / "js"), *servers], {}) == 0
    cluster = EmbeddedNatsCluster(
        servers={
            name: EmbeddedNats.from_config(
                str(out / f"nats-server-{name}.conf"), client, str(tmp_path / f"{name}.log")
            )
            for name, (client, _) in ports.items()
        }
    )
    with cluster:
        bus = Bus(
            NatsSettings(url=cluster.url, credentials=str(out / "creds" / "coordinator.creds"))
        )
        await bus.connect(attempts=1)
        try:
            assert bus.auth_required
            # Asked for: the INFO a first connect gets may predate the cluster's forming.
            stream = AlertStream(bus, SUBJECTS, replicas=3)

            async def set_up() -> bool:
                # The cluster elects its JetStream meta leader first.
                try:
                    await stream.setup()
                except (nats.errors.Error, TimeoutError):
                    return False
                return True

            await eventually(set_up, within_s=30)
            assert stream.replicas == 3
            info = await bus.jetstream(timeout_s=5).stream_info(STREAM)
            assert info.cluster is not None and info.cluster.name == "fleet"
            members = {info.cluster.leader, *(r.name for r in info.cluster.replicas or [])}
            assert members == set(ports)
            assert {p.name for p in (tmp_path / "js").iterdir()} == set(ports)
        finally:
            await bus.close()


async def test_an_agent_hears_its_own_nodes_bookings_in_any_pool_and_no_others(
    secured: Secured,
) -> None:
    """Bookings name tenants and reservations: A's credentials subscribe to A's bookings
    subject (in its pool and another, as after a pool move), never to B's nor to all."""
    coordinator = await secured.connect("coordinator")
    errors: list[str] = []
    a = await secured.connect(agent_user(NODE_A), errors)
    other_pool = new_pool_id()
    try:
        heard = Collector()
        await a.subscribe(SUBJECTS.bookings("*", NODE_A.node_id), cb=heard.add)
        await a.subscribe(SUBJECTS.bookings(POOL, NODE_B.node_id), cb=heard.add)
        await a.subscribe(SUBJECTS.bookings("*", "*"), cb=heard.add)
        await a.flush()
        for subject in (
            SUBJECTS.bookings(POOL, NODE_B.node_id),
            SUBJECTS.bookings(POOL, NODE_A.node_id),
            SUBJECTS.bookings(other_pool, NODE_A.node_id),
        ):
            await coordinator.publish(subject, b"{}")
        await coordinator.flush()
        own = {
            SUBJECTS.bookings(POOL, NODE_A.node_id),
            SUBJECTS.bookings(other_pool, NODE_A.node_id),
        }

        async def own_arrived() -> bool:
            if not own <= set(heard.subjects):
                # A refused subscription costs A an error; resend in case A was reconnecting.
                for subject in own:
                    await coordinator.publish(subject, b"{}")
                await coordinator.flush()
            return own <= set(heard.subjects)

        await eventually(own_arrived)
        assert set(heard.subjects) == own
        refusals = lower(SUBJECTS.bookings(POOL, NODE_B.node_id), SUBJECTS.bookings("*", "*"))
        # Refusals may reach the callback after the messages A was allowed to hear.
        await eventually(all_seen(errors, set(), refusals))
        assert denied(errors, "subscription") == refusals
        # Nor may an agent send bookings to anyone, itself included.
        await a.publish(SUBJECTS.bookings(POOL, NODE_A.node_id), b"{}")
        await a.flush()
        forged = SUBJECTS.bookings(POOL, NODE_A.node_id).lower()

        async def refused() -> bool:
            return forged in denied(errors, "publish")

        await eventually(refused)
    finally:
        await a.close()
        await coordinator.close()
