"""The heartbeat fast lane: messages of the hottest subscription taken from nats-py's
parser as raw (subject, payload), queued in our own bounded queue, and handed to a
synchronous handler in batches.

nats-py turns each message into a `Msg` through two coroutines (`_process_msg`,
`_process_headers`), an `asyncio.Queue` put and get, and a callback coroutine: at tens
of thousands of heartbeats a second that is about as much work as validating and
applying them (bench/ingest_bench.py). A plain message (no headers, no reply) for a
subscription registered here skips all of it; anything else goes the usual way.

Nothing is lost silently: the queue is bounded like a nats-py subscription (messages
and bytes), and a message that does not fit is dropped and reported through `on_full`,
which the bus counts as a slow consumer — our own outage, as liveness takes it.
`backlog` is what waits, for the ingest-behind check. nats-py's own bookkeeping for
the message (its statistics, the subscription's delivered count) is kept.

The protocol parser is nats-py's too, but its loop costs about as much again: per
message a regex over the buffer's head, a dict of arguments, two copies of the payload
and a coroutine to await. `_parse` runs first on each read: it takes the run of
complete plain `MSG` frames for lane subscriptions at the head of the buffer in one
synchronous pass (one copy of the read, a regex per frame) and hands whatever follows
— a PING, an INFO, a frame with headers or a reply, another subscription's, a frame
not complete yet, anything it does not recognise — to nats-py's parser unchanged, so
the protocol stays nats-py's to speak.

This hooks two private methods of nats-py's client, on this client instance only
(`_process_msg`, and `parse` of its parser `_ps`); `install` returns None where they or
the client's subscription table are missing, and the bus then uses the ordinary
callback path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from nats.aio.client import Client

log = logging.getLogger(__name__)

RawHandler = Callable[[str, bytes], None]
ProcessMsg = Callable[[int, bytes, bytes, bytes, Any], Awaitable[None]]
Parse = Callable[[bytes], Awaitable[None]]

# nats-py's parser states (nats/protocol/parser.py): between frames / inside a payload.
AWAITING_CONTROL_LINE = 1
# `MSG <subject> <sid> <size>\r\n` (no reply) as nats-server writes it, single spaces;
# anything else is left to nats-py's more lenient parser.
_MSG_NO_REPLY = re.compile(rb"MSG ([^ \r\n]+) (\d+) (\d+)\r\n")

# Messages handled per turn of the event loop (then the API, the sweep, the reader run).
# Small on purpose: each turn the reader moves a 32 KiB read (~100 heartbeats) from the
# socket into the queue, so the backlog builds here — bounded, and every drop counted —
# not in the server's buffer for us, whose overflow (or a PONG stuck behind it) costs
# the connection and, uncounted, everything in it.
BATCH = 16


class FastLane:
    def __init__(
        self,
        client: Client,
        original: ProcessMsg,
        original_parse: Parse,
        *,
        max_msgs: int,
        max_bytes: int,
        on_full: Callable[[str], None],
    ) -> None:
        self._client = client
        self._original = original
        self._original_parse = original_parse
        self._parser = client._ps
        self._handlers: dict[int, RawHandler] = {}
        # The queue as three deques in step (handler, subject, payload), not a deque of
        # tuples: a backlog of 100,000 tuples is 100,000 objects for the cyclic GC to
        # walk on every full collection; handlers are few and bytes are not tracked.
        self._handles: deque[RawHandler] = deque()
        self._subjects: deque[bytes] = deque()
        self._payloads: deque[bytes] = deque()
        self._bytes = 0
        self.max_msgs = max_msgs
        self.max_bytes = max_bytes
        self._on_full = on_full
        self._wake = asyncio.Event()
        self._waiting = False  # the drain task waits for `_wake` (else it will look again)
        self._task = asyncio.get_running_loop().create_task(self._drain(), name="bus-fast-lane")

    @classmethod
    def install(
        cls, client: Client, *, max_msgs: int, max_bytes: int, on_full: Callable[[str], None]
    ) -> FastLane | None:
        original = getattr(client, "_process_msg", None)
        parser = getattr(client, "_ps", None)
        original_parse = getattr(parser, "parse", None)
        if (
            original is None
            or original_parse is None
            or not isinstance(getattr(parser, "buf", None), bytearray)
            or getattr(parser, "state", None) != AWAITING_CONTROL_LINE
            or not isinstance(getattr(client, "_subs", None), dict)
        ):
            log.info("nats-py without the parser hooks this expects: no heartbeat fast lane")
            return None
        lane = cls(
            client,
            original,
            original_parse,
            max_msgs=max_msgs,
            max_bytes=max_bytes,
            on_full=on_full,
        )
        client._process_msg = lane._process_msg  # type: ignore[method-assign]
        parser.parse = lane._parse  # type: ignore[union-attr]
        return lane

    def add(self, sid: int, handle: RawHandler) -> None:
        """Plain messages of subscription `sid` go to `handle` (which never raises)."""
        self._handlers[sid] = handle

    @property
    def backlog(self) -> int:
        return len(self._payloads)

    async def _process_msg(
        self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: Any
    ) -> None:
        handle = self._handlers.get(sid)
        if handle is None or headers or reply:
            await self._original(sid, subject, reply, data, headers)
            return
        self._offer(sid, handle, subject, data)

    def _offer(self, sid: int, handle: RawHandler, subject: bytes, data: bytes) -> None:
        sub = self._client._subs.get(sid)
        if sub is None:  # unsubscribed: nats-py's path skips it the same way
            return
        # What nats-py's own path records for a delivered message.
        size = len(data)
        stats = self._client.stats
        stats["in_msgs"] += 1
        stats["in_bytes"] += size
        sub._received += 1
        if len(self._payloads) >= self.max_msgs or self._bytes + size > self.max_bytes:
            self._on_full(subject.decode(errors="replace"))
            return
        self._handles.append(handle)
        self._subjects.append(subject)
        self._payloads.append(data)
        self._bytes += size
        if not self._waiting:
            return
        self._waiting = False
        self._wake.set()

    async def _parse(self, data: bytes = b"") -> None:
        """One read from the server: the lane's frames at its head here, the rest (from
        the first frame that is not one) to nats-py's parser. A lane frame or a control
        line cut by the end of the read waits in the buffer for the next read, as it
        would in nats-py's parser (handing it over would send every frame of the next
        read the slow way)."""
        parser = self._parser
        if parser.state != AWAITING_CONTROL_LINE:  # inside a frame nats-py started
            await self._original_parse(data)
            return
        buf = parser.buf
        buf.extend(data)
        raw = bytes(buf)
        end, pos, handlers, match = len(raw), 0, self._handlers, _MSG_NO_REPLY.match
        wait = False  # what is left is a lane frame or a control line, cut short
        while True:
            frame = match(raw, pos)
            if frame is None:
                wait = raw.find(b"\r\n", pos) < 0
                break
            sid = int(frame.group(2))
            handle = handlers.get(sid)
            if handle is None:
                break
            payload_at = frame.end()
            payload_end = payload_at + int(frame.group(3))
            if payload_end + 2 > end:
                wait = True
                break
            self._offer(sid, handle, frame.group(1), raw[payload_at:payload_end])
            pos = payload_end + 2
        if pos:
            del buf[:pos]
        if buf and not wait:
            await self._original_parse(b"")

    def _handle_next(self) -> None:
        data = self._payloads.popleft()
        self._bytes -= len(data)
        self._handles.popleft()(self._subjects.popleft().decode(errors="replace"), data)

    async def _drain(self) -> None:
        handles, subjects, payloads = self._handles, self._subjects, self._payloads
        while True:
            if not payloads:
                self._waiting = True
                await self._wake.wait()
                self._wake.clear()
            while payloads:
                for _ in range(min(BATCH, len(payloads))):  # `_handle_next`, inline
                    data = payloads.popleft()
                    self._bytes -= len(data)
                    handles.popleft()(subjects.popleft().decode(errors="replace"), data)
                await asyncio.sleep(0)

    async def close(self) -> None:
        """Stop; what still waits is handled first (a clean close loses nothing)."""
        while self._payloads:
            self._handle_next()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
