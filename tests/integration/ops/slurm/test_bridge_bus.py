"""The Slurm bridge on a secured bus: the user `gpufleet nats-auth --forwarder
slurm-bridge` makes (`forwarder:slurm-bridge`) is all it needs. Through its credentials
file and its own connect path it creates its durable consumer, reads, holds
(`in_progress`), hands back (`nak`) and acknowledges alerts, with no permission
violation; and it cannot take the alert forwarder's consumer."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import nats.errors
import pytest
from nats.js.api import AckPolicy, ConsumerConfig

from coordinator.bus.alerts import AlertStream
from coordinator.bus.connection import Bus
from ops.kit.embedded_nats import EmbeddedNats
from ops.kit.nats_bundle import AuthBundle, build, write_bundle
from ops.kit.nats_users import DEFAULT_FORWARDER_DURABLE, bcrypt_hasher, forwarder_user
from ops.slurm.bridge.daemon import SlurmBridge
from ops.slurm.bridge.settings import BridgeSettings
from procs.nats import NatsSettings, ProbedNatsSettings
from shared.ids import new_pool_id
from shared.streams import stream_name
from shared.subjects import Subjects
from shared.wire import Alert
from tests.waiting import eventually

PREFIX = "tslurm"
DURABLE = "slurm-bridge"
STREAM = stream_name(PREFIX)


@dataclass
class Secured:
    server: EmbeddedNats
    bundle: AuthBundle
    creds: Path

    def creds_file(self, user: str) -> Path:
        return self.creds / next(u for u in self.bundle.users if u.name == user).creds_filename


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    out = tmp_path_factory.mktemp("nats-auth")
    bundle = build(
        [], alert_stream=STREAM, prefix=PREFIX, forwarders=[DEFAULT_FORWARDER_DURABLE, DURABLE],
        hash_password=bcrypt_hasher(4), store_dir=None,
    )  # fmt: skip
    write_bundle(out, bundle)
    with EmbeddedNats(config_file=str(out / "nats-server.conf")) as server:
        yield Secured(server, bundle, out / "creds")


async def _publish(secured: Secured, n: int) -> list[str]:
    bus = Bus(
        NatsSettings(url=secured.server.url, credentials=str(secured.creds_file("coordinator")))
    )
    await bus.connect(attempts=1)
    ids = []
    try:
        stream = AlertStream(bus, Subjects(PREFIX))
        await stream.setup()
        for _ in range(n):
            alert = Alert(
                alert_id=f"a-{secrets.token_hex(6)}", kind="node.maintenance",
                pool_id=new_pool_id(), node_id="sim-a", at=int(time.time() * 1000),
            )  # fmt: skip
            await stream.publish(alert)
            ids.append(alert.alert_id)
    finally:
        await bus.close()
    return ids


async def test_the_bridge_follows_the_stream_with_a_forwarder_user_and_nothing_more(
    secured: Secured, caplog: pytest.LogCaptureFixture
) -> None:
    ids = await _publish(secured, 3)
    bridge = SlurmBridge(
        BridgeSettings(
            nats=ProbedNatsSettings(
                url=secured.server.url, subject_prefix=PREFIX,
                credentials=str(secured.creds_file(forwarder_user(DURABLE))),
            ),
            durable=DURABLE,
            coordinator_key="unused", fetch_wait_s=0.5,
        )
    )  # fmt: skip
    nc = await bridge.connect()
    try:
        source = bridge.source(nc)
        await source.bind()

        async def all_three() -> bool:
            got = await source.fetch(10)
            seen.extend(got)
            return len(seen) >= 3

        seen: list[nats.aio.msg.Msg] = []
        await eventually(all_three, within_s=10)
        assert sorted(Alert.from_json(m.data).alert_id for m in seen) == sorted(ids)
        await seen[0].in_progress()
        await seen[1].nak()  # handed back: delivered again
        again: list[nats.aio.msg.Msg] = []

        async def redelivered() -> bool:
            again.extend(await source.fetch(10))
            return bool(again)

        await eventually(redelivered, within_s=10)
        for msg in [seen[0], seen[2], *again]:
            await msg.ack()

        async def settled() -> bool:
            info = await nc.jetstream(timeout=5).consumer_info(STREAM, DURABLE)
            return info.num_ack_pending == 0 and info.num_pending == 0

        await eventually(settled, within_s=10)
        assert source.errors == 0
        assert not [r for r in caplog.records if "violation" in r.getMessage().lower()]
        # The alert forwarder's durable is not the bridge's to read.
        with pytest.raises((nats.errors.Error, TimeoutError)):
            sub = await nc.jetstream(timeout=2).pull_subscribe_bind(
                DEFAULT_FORWARDER_DURABLE, STREAM
            )
            await sub.fetch(1, timeout=2)
    finally:
        await nc.close()


async def test_the_bridge_user_may_make_no_other_durable(secured: Secured) -> None:
    user = forwarder_user(DURABLE)
    nc = await nats.connect(
        secured.server.url, user=user, password=secured.bundle.passwords[user],
        allow_reconnect=False,
    )  # fmt: skip
    try:
        with pytest.raises((nats.errors.Error, TimeoutError)):
            await nc.jetstream(timeout=2).add_consumer(
                STREAM, ConsumerConfig(durable_name="other", ack_policy=AckPolicy.EXPLICIT)
            )
    finally:
        await nc.close()


def _refused(bridge: SlurmBridge) -> float:
    value = bridge.metrics.registry.get_sample_value(
        "gpufleet_slurm_bridge_refused_total", {"by": "nats"}
    )
    return value or 0.0


def _refused_twice(bridge: SlurmBridge) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return _refused(bridge) >= 2

    return check


async def test_wrong_credentials_are_a_counted_error(
    secured: Secured, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A password NATS refuses: the bridge keeps trying, and says so at ERROR (once a
    minute, not every try) and in gpufleet_slurm_bridge_refused_total{by="nats"}."""
    user = forwarder_user(DURABLE)
    good = secured.creds_file(user).read_text()
    wrong = tmp_path / "wrong.creds"
    wrong.write_text(good.replace(secured.bundle.passwords[user], "not-the-password"))
    bridge = SlurmBridge(
        BridgeSettings(
            nats=ProbedNatsSettings(
                url=secured.server.url, subject_prefix=PREFIX, credentials=str(wrong)
            ),
            durable=DURABLE,
            coordinator_key="unused",
        )
    )  # fmt: skip
    task = asyncio.create_task(bridge.connect())
    try:
        await eventually(_refused_twice(bridge), within_s=15)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "nats refused the bridge" in errors[0].getMessage(), errors


async def test_a_consumer_its_user_may_not_use_is_a_counted_error(
    secured: Secured, caplog: pytest.LogCaptureFixture
) -> None:
    """The bridge given another forwarder's user (its durable is not that user's):
    every refusal is counted and logged at ERROR with what to change, never a WARNING
    a second."""
    other = forwarder_user(DEFAULT_FORWARDER_DURABLE)
    bridge = SlurmBridge(
        BridgeSettings(
            nats=ProbedNatsSettings(
                url=secured.server.url, subject_prefix=PREFIX,
                credentials=str(secured.creds_file(other)),
            ),
            durable=DURABLE,
            coordinator_key="unused",
        )
    )  # fmt: skip
    nc = await bridge.connect()
    bind = asyncio.create_task(bridge.source(nc).bind())
    try:
        await eventually(_refused_twice(bridge), within_s=30)
    finally:
        bind.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await bind
        await nc.close()
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and f"--forwarder {DURABLE}" in errors[0], errors
    noise = [r for r in caplog.records if "violation" in r.getMessage().lower()]
    assert all(r.levelno == logging.ERROR for r in noise), noise
