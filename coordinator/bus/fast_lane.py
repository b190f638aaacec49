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

This hooks one private method of nats-py's client (`_process_msg`, on this client
instance only); `install` returns None where that method or the client's
subscription table is missing, and the bus then uses the ordinary callback path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from nats.aio.client import Client

log = logging.getLogger(__name__)

RawHandler = Callable[[str, bytes], None]
ProcessMsg = Callable[[int, bytes, bytes, bytes, Any], Awaitable[None]]

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
        *,
        max_msgs: int,
        max_bytes: int,
        on_full: Callable[[str], None],
    ) -> None:
        self._client = client
        self._original = original
        self._handlers: dict[int, RawHandler] = {}
        self._queue: deque[tuple[RawHandler, bytes, bytes]] = deque()
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
        if original is None or not isinstance(getattr(client, "_subs", None), dict):
            log.info("nats-py without the parser hook this expects: no heartbeat fast lane")
            return None
        lane = cls(client, original, max_msgs=max_msgs, max_bytes=max_bytes, on_full=on_full)
        client._process_msg = lane._process_msg  # type: ignore[method-assign]
        return lane

    def add(self, sid: int, handle: RawHandler) -> None:
        """Plain messages of subscription `sid` go to `handle` (which never raises)."""
        self._handlers[sid] = handle

    @property
    def backlog(self) -> int:
        return len(self._queue)

    async def _process_msg(
        self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: Any
    ) -> None:
        handle = self._handlers.get(sid)
        if handle is None or headers or reply:
            await self._original(sid, subject, reply, data, headers)
            return
        sub = self._client._subs.get(sid)
        if sub is None:  # unsubscribed: nats-py's path skips it the same way
            return
        # What nats-py's own path records for a delivered message.
        size = len(data)
        stats = self._client.stats
        stats["in_msgs"] += 1
        stats["in_bytes"] += size
        sub._received += 1
        if len(self._queue) >= self.max_msgs or self._bytes + size > self.max_bytes:
            self._on_full(subject.decode(errors="replace"))
            return
        self._queue.append((handle, subject, data))
        self._bytes += size
        if not self._waiting:
            return
        self._waiting = False
        self._wake.set()

    async def _drain(self) -> None:
        queue = self._queue
        while True:
            if not queue:
                self._waiting = True
                await self._wake.wait()
                self._wake.clear()
            while queue:
                for _ in range(min(BATCH, len(queue))):
                    handle, subject, data = queue.popleft()
                    self._bytes -= len(data)
                    handle(subject.decode(errors="replace"), data)
                await asyncio.sleep(0)

    async def close(self) -> None:
        """Stop; what still waits is handled first (a clean close loses nothing)."""
        while self._queue:
            handle, subject, data = self._queue.popleft()
            self._bytes -= len(data)
            handle(subject.decode(errors="replace"), data)
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
