"""A core NATS client for a process that publishes, subscribes and answers requests, and
must stay small (the agent: nats-py and what it imports cost it about 5 MB).

`connect` tries the pool's servers (once each, or until cancelled with `forever=True`);
once connected the client reconnects by itself, for ever, until `close`: the next
server is the chooser's (`servers.Chooser`, nats-py's `reconnect_to_server_handler`;
`RoundRobin` waiting `reconnect_time_wait_s` between rounds by default), subscriptions
are sent again on the new link, and `stats["reconnects"]` counts each new link.
`force_reconnect` leaves the current link for the next server (what the link probe does
with a hung server, `procs.nats_link`).

Publishing never queues while there is no link (`NotConnectedError`): a caller that
keeps only its latest state wants to know. `flush` round-trips a PING. Callbacks (one
per subscription, and error/disconnected/reconnected) run in the client's dispatcher
task (`subscription.Dispatcher`). The client's tasks (that dispatcher, the supervisor
reading the link and reconnecting, the link's pinger) are all cancelled and awaited by
`close`, which closes the socket too, whichever state the client is in."""

from __future__ import annotations

import asyncio
import ssl
from typing import Any
from urllib.parse import SplitResult

import msgspec

from procs.natsproto.auth import Credentials
from procs.natsproto.errors import ClosedError, NatsError, NotConnectedError, ServerError
from procs.natsproto.handshake import Hello, Opened, close_writer, open_link
from procs.natsproto.link import Link, LinkEvents
from procs.natsproto.parser import Msg as RawMsg
from procs.natsproto.servers import Chooser, RoundRobin, Server, ServerPool
from procs.natsproto.subscription import (
    Dispatcher,
    ErrorCallback,
    EventCallback,
    Msg,
    MsgCallback,
    Subscriptions,
    sub_line,
)

VERSION = "1.0"  # what CONNECT says this client is (nats-server logs it)


class ClientOptions(msgspec.Struct, frozen=True):
    servers: list[str]
    name: str = "gpufleet"
    credentials: Credentials = msgspec.field(default_factory=Credentials)
    tls: ssl.SSLContext | None = None
    connect_timeout_s: float = 2.0
    reconnect_time_wait_s: float = 2.0
    reconnect_to_server_handler: Chooser | None = None
    ping_interval_s: float = 120.0
    max_outstanding_pings: int = 2
    randomize: bool = True
    error_cb: ErrorCallback | None = None
    disconnected_cb: EventCallback | None = None
    reconnected_cb: EventCallback | None = None


def _bad_subject(subject: str) -> bool:
    return not subject or any(c in subject for c in " \t\r\n")


class Client:
    def __init__(self, options: ClientOptions) -> None:
        self.options = options
        self._pool = ServerPool(options.servers, randomize=options.randomize)
        self._choose: Chooser = options.reconnect_to_server_handler or RoundRobin(
            options.reconnect_time_wait_s
        )
        self._hello = Hello(options.name, VERSION, options.credentials, options.tls)
        self._subs = Subscriptions()
        self._dispatcher = Dispatcher(f"{options.name}-callbacks", options.error_cb)
        self._events = LinkEvents(self._on_msg, self._on_info, self._dispatcher.error)
        self._link: Link | None = None  # the link this client owns, until it is closed
        self._info: dict[str, Any] = {}
        self._supervisor: asyncio.Task[None] | None = None
        self._closed = False
        self.stats: dict[str, int] = {
            "in_msgs": 0, "out_msgs": 0, "in_bytes": 0, "out_bytes": 0, "reconnects": 0,
        }  # fmt: skip

    # -- state ------------------------------------------------------------------------------

    @property
    def is_connected(self) -> bool:
        return self._link is not None and self._link.open

    @property
    def connected_url(self) -> SplitResult | None:
        """The URL (urllib's) of the server of the live link, None when there is none."""
        link = self._link
        return link.url if link is not None and link.open else None

    # -- connecting -------------------------------------------------------------------------

    async def connect(self, *, forever: bool = False) -> None:
        """Connect to a server of the pool: each tried once (raising the last error
        when none took us), or, `forever`, until one does or the caller is cancelled.
        Every failed try goes to the error callback."""
        if self._closed:
            raise ClosedError("the NATS client is closed")
        if self._supervisor is not None:
            raise NatsError("the NATS client is connected already")
        self._dispatcher.start()
        server, opened = await self._attempt(forever)
        if self._closed:  # closed from another task meanwhile
            await close_writer(opened.writer)
            raise ClosedError("the NATS client is closed")
        self._adopt(server, opened)
        self._supervisor = asyncio.create_task(self._supervise(), name=f"{self.options.name}-link")

    async def _attempt(self, forever: bool) -> tuple[Server, Opened]:
        tries = 0
        last: Exception = NotConnectedError("no NATS server tried")
        while True:
            servers = list(self._pool.servers)
            if not forever and tries >= len(servers):
                raise last
            tries += 1
            server, delay = self._choose(servers, dict(self._info))
            if delay > 0:
                await asyncio.sleep(delay)
            try:
                opened = await open_link(server, self._hello, self.options.connect_timeout_s)
            except (OSError, TimeoutError, NatsError) as exc:
                last = exc
                self._dispatcher.error(exc)
                continue
            return server, opened

    def _adopt(self, server: Server, opened: Opened) -> None:
        """Make `opened` the client's link and subscribe it to every subscription."""
        self._info = opened.info
        self._pool.learn(opened.info, opened.tls)
        link = Link(
            opened,
            server.uri,
            self._events,
            ping_interval_s=self.options.ping_interval_s,
            max_outstanding=self.options.max_outstanding_pings,
            name=self.options.name,
        )
        self._link = link
        lines = self._subs.sub_lines()
        if lines:
            link.write(lines)

    async def _supervise(self) -> None:
        """Read the link; when it ends, reconnect (for ever) and read the next one."""
        while True:
            link = self._link
            assert link is not None
            await link.read()
            if link.error is not None and not isinstance(link.error, ServerError):
                self._dispatcher.error(link.error)  # a ServerError was told as it came
            await link.close()
            self._link = None
            if self.options.disconnected_cb is not None:
                self._dispatcher.call(self.options.disconnected_cb)
            server, opened = await self._attempt(forever=True)
            self._adopt(server, opened)
            self.stats["reconnects"] += 1
            if self.options.reconnected_cb is not None:
                self._dispatcher.call(self.options.reconnected_cb)

    async def force_reconnect(self) -> None:
        """Leave the current link (a hung server's) for the next server."""
        link = self._link
        if link is not None and link.open:
            link.abort()

    # -- reading ----------------------------------------------------------------------------

    def _on_msg(self, raw: RawMsg) -> None:
        self.stats["in_msgs"] += 1
        self.stats["in_bytes"] += len(raw.data)
        sub = self._subs.get(raw.sid)
        if sub is None:
            return
        callback = sub.callback
        msg = Msg(raw.subject, raw.reply, raw.data, self.publish)
        self._dispatcher.call(lambda: callback(msg))

    def _on_info(self, info: dict[str, Any]) -> None:
        self._info = info
        link = self._link
        self._pool.learn(info, link is not None and link.tls)

    # -- writing ----------------------------------------------------------------------------

    def _live(self) -> Link:
        link = self._link
        if link is None or not link.open:
            raise (
                ClosedError("the NATS client is closed")
                if self._closed
                else (NotConnectedError("not connected to NATS"))
            )
        return link

    async def publish(self, subject: str, data: bytes, reply: str = "") -> None:
        """Hand `data` to the link for `subject` (NotConnectedError without one)."""
        if _bad_subject(subject) or (reply and _bad_subject(reply)):
            raise ValueError(f"not a NATS subject: {subject!r} (reply {reply!r})")
        link = self._live()
        target = f"{subject} {reply}" if reply else subject
        head = f"PUB {target} {len(data)}\r\n"
        link.write(head.encode() + data + b"\r\n")
        self.stats["out_msgs"] += 1
        self.stats["out_bytes"] += len(data)

    async def subscribe(self, subject: str, cb: MsgCallback) -> int:
        """Have `cb` called with every message on `subject`, on this link and every
        later one; the subscription's sid."""
        if _bad_subject(subject):
            raise ValueError(f"not a NATS subject: {subject!r}")
        if self._closed:
            raise ClosedError("the NATS client is closed")
        sub = self._subs.add(subject, cb)
        if self.is_connected:
            self._live().write(sub_line(sub))
        return sub.sid

    # nats-py's signature, which `procs.nats_link.NatsLink` asks of both clients.
    async def flush(self, timeout: float = 10.0) -> None:  # noqa: ASYNC109
        """Round-trip a PING: everything written before it has reached the server.
        TimeoutError after `timeout` s; NotConnectedError when the link is lost first."""
        future = self._live().ping()
        async with asyncio.timeout(timeout):
            await future

    # -- closing ----------------------------------------------------------------------------

    async def close(self) -> None:
        """Stop for good: every task this client started is cancelled and awaited, the
        socket closed. Not from inside one of the client's own callbacks."""
        self._closed = True
        supervisor, self._supervisor = self._supervisor, None
        try:
            if supervisor is not None:
                supervisor.cancel()
                await asyncio.gather(supervisor, return_exceptions=True)
        finally:
            link, self._link = self._link, None
            try:
                if link is not None:
                    await link.close()
            finally:
                await self._dispatcher.stop()
