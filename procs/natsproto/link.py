"""One live link to one server, from the handshake's end to its loss: reading the
server's operations (messages handed to the client, PINGs answered, PONGs matched in
order to the PINGs sent, -ERRs reported), writing, and pinging every `ping_interval_s`
(the link is stale after `max_outstanding` PINGs without a PONG).

`read` runs in the client's supervising task and returns when the link ends: the server
closed it, a stale link, a protocol error, or `abort()` (a forced reconnect, a close).
The pinger is this link's own task, cancelled and awaited by `close()`, which also
closes the socket and fails every flush still waiting on this link."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any
from urllib.parse import SplitResult

import msgspec

from procs.natsproto.errors import (
    AuthorizationError,
    NatsError,
    NotConnectedError,
    OutboundBufferFullError,
    ServerError,
)
from procs.natsproto.handshake import READ_CHUNK, Opened, close_writer
from procs.natsproto.parser import Err, Info, Msg, Ping, Pong

# What may wait in the socket's buffer before a publish is refused (nats-py's default).
MAX_PENDING_BYTES = 2 * 1024 * 1024


class StaleConnectionError(NatsError):
    """No PONG to `max_outstanding` PINGs in a row."""


class LinkEvents(msgspec.Struct, frozen=True):
    """What the link hands back to its client as it reads."""

    on_msg: Callable[[Msg], None]
    on_info: Callable[[dict[str, Any]], None]
    on_error: Callable[[Exception], None]


class Link:
    def __init__(
        self,
        opened: Opened,
        url: SplitResult,
        events: LinkEvents,
        *,
        ping_interval_s: float,
        max_outstanding: int,
        name: str,
    ) -> None:
        self.url = url
        self.tls = opened.tls
        self.info = opened.info
        self._reader = opened.reader
        self._writer = opened.writer
        self._parser = opened.parser
        self._events = events
        self._ping_interval_s = ping_interval_s
        self._max_outstanding = max_outstanding
        # One entry per PING this link sent, in order: a flush's future, or None for
        # the pinger's. A flush that gave up leaves its (cancelled) future in place, so
        # a late PONG still pairs with its own PING.
        self._pongs: deque[asyncio.Future[None] | None] = deque()
        self._outstanding = 0
        self.open = True
        self.error: Exception | None = None  # why the link ended, when it did not just close
        self._pinger = asyncio.create_task(self._ping_loop(), name=f"{name}-pinger")

    # -- writing ----------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        if not self.open:
            raise NotConnectedError("not connected to NATS")
        if self._writer.transport.get_write_buffer_size() > MAX_PENDING_BYTES:
            raise OutboundBufferFullError("too much waiting to be written to NATS")
        self._writer.write(data)

    def ping(self) -> asyncio.Future[None]:
        """A PING; the future is done when its PONG comes."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.write(b"PING\r\n")
        self._pongs.append(future)
        return future

    # -- reading ----------------------------------------------------------------------------

    async def read(self) -> None:
        """Read until the link ends; why it ended is in `error` (None: closed)."""
        try:
            while self.open:
                self._handle_ops()
                data = await self._reader.read(READ_CHUNK)
                if not data:
                    break
                self._parser.feed(data)
        except Exception as exc:  # whatever ends the link, the client reconnects (and says why)
            self.error = self.error or exc
        finally:
            self.open = False

    def _handle_ops(self) -> None:
        while self.open and (op := self._parser.next()) is not None:
            if isinstance(op, Msg):
                self._events.on_msg(op)
            elif isinstance(op, Pong):
                self._outstanding = 0
                if self._pongs:
                    future = self._pongs.popleft()
                    if future is not None and not future.done():
                        future.set_result(None)
            elif isinstance(op, Ping):
                self._writer.write(b"PONG\r\n")
            elif isinstance(op, Info):
                self.info = op.fields
                self._events.on_info(op.fields)
            elif isinstance(op, Err):
                self._server_error(op.text)

    def _server_error(self, text: str) -> None:
        if "permissions violation" in text.lower():
            # The server refused one publish or subscription; the link stays up.
            self._events.on_error(ServerError(text))
            return
        # Every other -ERR is followed by the server closing the link.
        error: ServerError = (
            AuthorizationError(text)
            if "authorization violation" in text.lower()
            else ServerError(text)
        )
        self._events.on_error(error)
        self.error = error
        self.abort()

    async def _ping_loop(self) -> None:
        while True:
            await asyncio.sleep(self._ping_interval_s)
            if self._outstanding >= self._max_outstanding:
                self.error = StaleConnectionError("stale connection: no PONG from NATS")
                self.abort()
                return
            self._outstanding += 1
            try:
                self.write(b"PING\r\n")
            except NatsError:
                return
            self._pongs.append(None)

    # -- ending -----------------------------------------------------------------------------

    def abort(self) -> None:
        """End the link now: the socket closes and `read` returns."""
        self.open = False
        self._writer.transport.abort()

    async def close(self) -> None:
        """Stop the pinger, close the socket, and fail every flush still waiting."""
        self.open = False
        self._pinger.cancel()
        try:
            await asyncio.gather(self._pinger, return_exceptions=True)
        finally:
            await close_writer(self._writer)
            while self._pongs:
                future = self._pongs.popleft()
                if future is not None and not future.done():
                    future.set_exception(NotConnectedError("the link to NATS was lost"))
