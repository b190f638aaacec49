"""Subscriptions and the one task that runs their callbacks.

`Subscriptions` maps each sid to its subject and callback, and gives the SUB lines a
new link must send again after a reconnect. `Dispatcher` runs every callback the client
makes (messages, and the error/disconnected/reconnected events) one after another in a
single named task, in the order they came: a slow callback delays the next one but
never the reading of the socket, and none is ever left running on its own. A callback's
exception goes to the error callback; the error callback's own is logged."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import msgspec

log = logging.getLogger(__name__)


class Msg(msgspec.Struct, frozen=True):
    """A message as a subscription callback gets it; `respond` answers on `reply`."""

    subject: str
    reply: str
    data: bytes
    _publish: Callable[[str, bytes], Awaitable[None]]

    async def respond(self, data: bytes) -> None:
        if not self.reply:
            raise ValueError("the message has no reply subject")
        await self._publish(self.reply, data)


MsgCallback = Callable[[Msg], Awaitable[None]]
ErrorCallback = Callable[[Exception], Awaitable[None]]
EventCallback = Callable[[], Awaitable[None]]


class Subscription(msgspec.Struct, frozen=True):
    sid: int
    subject: str
    callback: MsgCallback


class Subscriptions:
    def __init__(self) -> None:
        self._by_sid: dict[int, Subscription] = {}
        self._last_sid = 0

    def add(self, subject: str, callback: MsgCallback) -> Subscription:
        self._last_sid += 1
        sub = Subscription(self._last_sid, subject, callback)
        self._by_sid[sub.sid] = sub
        return sub

    def get(self, sid: int) -> Subscription | None:
        return self._by_sid.get(sid)

    def sub_lines(self) -> bytes:
        """SUB for every subscription, for a new link."""
        return b"".join(sub_line(s) for s in self._by_sid.values())


def sub_line(sub: Subscription) -> bytes:
    return f"SUB {sub.subject} {sub.sid}\r\n".encode()


class Dispatcher:
    def __init__(self, name: str, on_error: ErrorCallback | None) -> None:
        self._name = name
        self._on_error = on_error
        self._queue: asyncio.Queue[Callable[[], Awaitable[None]]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=self._name)

    def call(self, job: Callable[[], Awaitable[None]]) -> None:
        """Run `job` after every job handed over before it."""
        self._queue.put_nowait(job)

    def error(self, exc: Exception) -> None:
        """Tell the error callback (if any) about `exc`, in turn."""
        on_error = self._on_error
        if on_error is not None:
            self.call(lambda: on_error(exc))

    async def _run(self) -> None:
        while True:
            job = await self._queue.get()
            try:
                await job()
            except Exception as exc:
                await self._report(exc)

    async def _report(self, exc: Exception) -> None:
        if self._on_error is None:
            log.warning("nats callback failed: %r", exc)
            return
        try:
            await self._on_error(exc)
        except Exception:
            log.exception("nats error callback failed")

    async def stop(self) -> None:
        """Cancel the task and wait for it; jobs not yet run are dropped."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
