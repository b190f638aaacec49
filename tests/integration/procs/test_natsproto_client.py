"""The agent's own NATS client (`procs.natsproto`) against a real nats-server: publish
and subscribe, requests answered both ways with nats-py on the other side, a password
taken and one refused, TLS, a server restarted (reconnected, subscriptions resumed), a
forced reconnect, a flush given up on a hung server that leaves the link reading, a
link left when its pings go unanswered, and `close` leaving no task and no socket behind
in any state (pytest's filterwarnings=error turns an unclosed socket into a failure)."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import pytest
from nats.aio.msg import Msg as PyMsg

from ops.kit.embedded_nats import EmbeddedNats, free_port
from procs.nats import tls_context
from procs.natsproto import (
    AuthorizationError,
    Client,
    ClientOptions,
    Credentials,
    Msg,
    NotConnectedError,
)
from procs.natsproto.link import StaleConnectionError
from tests.waiting import eventually


class Events:
    """What a client's callbacks told, in order."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.errors: list[Exception] = []

    async def error(self, exc: Exception) -> None:
        self.errors.append(exc)

    async def disconnected(self) -> None:
        self.log.append("disconnected")

    async def reconnected(self) -> None:
        self.log.append("reconnected")


def options(url: str, events: Events | None = None, **kw: object) -> ClientOptions:
    events = events or Events()
    values: dict[str, object] = {
        "servers": [url],
        "name": "natsproto-test",
        "reconnect_time_wait_s": 0.1,
        "connect_timeout_s": 5.0,  # a loaded machine, a server just started
        "error_cb": events.error,
        "disconnected_cb": events.disconnected,
        "reconnected_cb": events.reconnected,
    }
    values.update(kw)
    return ClientOptions(**values)  # type: ignore[arg-type]


def own_tasks() -> set[str]:
    """Names of the running tasks a natsproto client started (they carry its name)."""
    return {t.get_name() for t in asyncio.all_tasks() if "natsproto-test" in t.get_name()}


@contextlib.asynccontextmanager
async def connected(opts: ClientOptions) -> AsyncIterator[Client]:
    client = Client(opts)
    await client.connect()
    try:
        yield client
    finally:
        await client.close()
    assert not own_tasks()


class Inbox:
    def __init__(self) -> None:
        self.queue: asyncio.Queue[Msg] = asyncio.Queue()

    async def put(self, msg: Msg) -> None:
        await self.queue.put(msg)

    async def get(self, wait: float = 10.0) -> Msg:
        return await asyncio.wait_for(self.queue.get(), wait)


async def test_publish_and_subscribe_round_trip(nats_url: str) -> None:
    inbox = Inbox()
    async with connected(options(nats_url)) as client:
        assert client.is_connected and client.connected_url.port == int(nats_url.rsplit(":")[-1])
        await client.subscribe("natsproto.rt", inbox.put)
        await client.flush(5)
        for i in range(3):
            await client.publish("natsproto.rt", f"m{i}".encode())
        got = [(await inbox.get()).data for _ in range(3)]
        assert got == [b"m0", b"m1", b"m2"]
        assert client.stats["out_msgs"] == 3 and client.stats["in_msgs"] == 3
        assert client.stats["in_bytes"] == client.stats["out_bytes"] == 6
        with pytest.raises(ValueError):
            await client.publish("has space", b"")
    assert not client.is_connected
    with pytest.raises(NotConnectedError):
        await client.publish("natsproto.rt", b"late")


async def test_requests_answered_both_ways_with_nats_py(nats_url: str) -> None:
    other = await nats.connect(nats_url)
    try:

        async def echo(msg: PyMsg) -> None:
            await msg.respond(msg.data.upper())

        # Subscribed before our client connects: nats-server (2.15, JetStream on) now
        # and then misses, for a first publish, interest that came after the
        # publisher connected (nats-py as the publisher too: 7 in 150).
        await other.subscribe("natsproto.echo", cb=echo)
        await other.flush()
        async with connected(options(nats_url)) as client:

            async def answer(msg: Msg) -> None:
                await msg.respond(b"pong:" + msg.data)

            await client.subscribe("natsproto.ask", answer)
            await client.flush(5)
            reply = await other.request("natsproto.ask", b"ping", timeout=5)
            assert reply.data == b"pong:ping"
            inbox = Inbox()
            await client.subscribe("natsproto.replies.1", inbox.put)
            await client.publish("natsproto.echo", b"shout", reply="natsproto.replies.1")
            answered = await inbox.get()
            assert (answered.subject, answered.data) == ("natsproto.replies.1", b"SHOUT")
    finally:
        await other.close()


@contextlib.contextmanager
def server_with(tmp_path: Path, config: str) -> Iterator[EmbeddedNats]:
    path = tmp_path / "nats-server.conf"
    path.write_text(config)
    with EmbeddedNats(config_file=str(path), store_dir=str(tmp_path / "js")) as server:
        yield server


USERS = 'authorization { users = [ { user: "agent", password: "s3cret" } ] }\n'


async def test_a_password_is_taken_and_a_wrong_one_refused(tmp_path: Path) -> None:
    with server_with(tmp_path, USERS) as server:
        good = options(server.url, credentials=Credentials(user="agent", password="s3cret"))
        async with connected(good) as client:
            await client.flush(5)
        events = Events()
        bad = options(server.url, events, credentials=Credentials(user="agent", password="wrong"))
        client = Client(bad)
        with pytest.raises(AuthorizationError, match=r"(?i)authorization violation"):
            await client.connect()
        await client.close()
        assert not own_tasks()
        assert "s3cret" not in repr(good.credentials)


def make_certificate(directory: Path) -> tuple[Path, Path]:
    cert, key = directory / "server.pem", directory / "server.key"
    made = subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
         "-keyout", str(key), "-out", str(cert)],
        capture_output=True, timeout=60,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    return cert, key


async def test_tls_when_the_server_requires_it_and_verified_against_the_ca(
    tmp_path: Path,
) -> None:
    cert, key = make_certificate(tmp_path)
    config = f'tls {{ cert_file: "{cert}"\n key_file: "{key}" }}\n'
    with server_with(tmp_path, config) as server:
        tls = tls_context(str(cert))
        for url in (server.url, server.url.replace("nats://", "tls://")):
            inbox = Inbox()
            async with connected(options(url, tls=tls)) as client:
                await client.subscribe("natsproto.tls", inbox.put)
                await client.publish("natsproto.tls", b"private")
                assert (await inbox.get()).data == b"private"
        # Not verified against the system's store: a self-signed server is refused.
        client = Client(options(server.url))
        with pytest.raises(OSError, match=r"(?i)certificate"):
            await client.connect()
        await client.close()


async def test_a_restarted_server_is_reconnected_and_subscriptions_resume(
    tmp_path: Path,
) -> None:
    with EmbeddedNats(store_dir=str(tmp_path / "js")) as server:
        events = Events()
        inbox = Inbox()
        async with connected(options(server.url, events)) as client:
            await client.subscribe("natsproto.restart", inbox.put)
            await client.publish("natsproto.restart", b"before")
            assert (await inbox.get()).data == b"before"
            await asyncio.to_thread(server.restart, 0.5)

            async def back() -> bool:
                return client.is_connected and "reconnected" in events.log

            await eventually(back, within_s=20)
            assert events.log == ["disconnected", "reconnected"]
            assert client.stats["reconnects"] == 1
            # Published by another client: our subscription was sent again.
            other = await nats.connect(server.url)
            try:
                await other.publish("natsproto.restart", b"after")
                await other.flush()
            finally:
                await other.close()
            assert (await inbox.get()).data == b"after"


async def test_close_while_no_server_answers_leaves_nothing_running(tmp_path: Path) -> None:
    with EmbeddedNats(store_dir=str(tmp_path / "js")) as server:
        client = Client(options(server.url))
        await client.connect()
        server.stop()

        async def lost() -> bool:
            return not client.is_connected

        await eventually(lost)
        await asyncio.sleep(0.3)  # a few reconnect rounds against a closed port
        await client.close()
        assert not own_tasks()
    # Never connected: a connect that tries for ever is cancelled, then closed.
    client = Client(options(f"nats://127.0.0.1:{free_port()}"))
    attempt = asyncio.create_task(client.connect(forever=True), name="natsproto-test-connect")
    await asyncio.sleep(0.3)
    attempt.cancel()
    await asyncio.gather(attempt, return_exceptions=True)
    await client.close()
    assert not own_tasks()


async def test_a_forced_reconnect_moves_to_a_new_link(nats_url: str) -> None:
    events = Events()
    inbox = Inbox()
    async with connected(options(nats_url, events)) as client:
        await client.subscribe("natsproto.forced", inbox.put)
        await client.flush(5)
        await client.force_reconnect()
        assert not client.is_connected

        async def back() -> bool:
            return client.stats["reconnects"] == 1 and client.is_connected

        await eventually(back)
        await client.flush(5)
        await client.publish("natsproto.forced", b"again")
        assert (await inbox.get()).data == b"again"


async def test_a_flush_given_up_on_a_hung_server_leaves_the_link_reading(
    tmp_path: Path,
) -> None:
    """A PONG that comes after its flush gave up pairs with its own PING: later flushes
    and messages are still read (nats-py 2.16 stops reading there)."""
    with EmbeddedNats(store_dir=str(tmp_path / "js")) as server:
        inbox = Inbox()
        async with connected(options(server.url, ping_interval_s=60)) as client:
            await client.subscribe("natsproto.late", inbox.put)
            await client.flush(5)
            server.pause()
            await asyncio.sleep(0.1)  # the signal is delivered asynchronously
            try:
                with pytest.raises(TimeoutError):
                    await client.flush(0.3)
            finally:
                server.resume()
            await client.flush(5)
            await client.publish("natsproto.late", b"still reading")
            assert (await inbox.get()).data == b"still reading"
            assert client.stats["reconnects"] == 0


async def test_a_server_that_answers_no_pings_is_left_and_found_again(tmp_path: Path) -> None:
    """The client's own pings: `max_outstanding_pings` without a PONG end the link (the
    old socket closed), and the client reconnects once the server answers again."""
    with EmbeddedNats(store_dir=str(tmp_path / "js")) as server:
        events = Events()
        opts = options(server.url, events, ping_interval_s=0.2, max_outstanding_pings=2)
        async with connected(opts) as client:
            await client.flush(5)
            server.pause()
            try:

                async def lost() -> bool:
                    return not client.is_connected

                await eventually(lost, within_s=10)
            finally:
                server.resume()

            async def back() -> bool:
                return client.is_connected and "reconnected" in events.log

            await eventually(back, within_s=20)
            assert any(isinstance(e, StaleConnectionError) for e in events.errors)
            await client.flush(5)
