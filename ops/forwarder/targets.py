"""One delivery state per target. Each target has its own bounded queue and its own
retry loop, so a target that fails delays only itself: the others keep delivering.

A queue item is one gpufleet alert, with the `Pending` that acknowledges its stream
message once every target is done with it: delivered, refused (a 4xx that retrying
cannot change), or dropped because the target's queue was full (counted, logged).
Connection errors, timeouts, 408, 425, 429 and 5xx are retried with capped
exponential backoff; meanwhile the messages held are kept from JetStream's redelivery
with `in_progress`.

An Alertmanager target also re-sends every firing condition each resend interval with
`endsAt` = now + `RESEND_HOLD` intervals, as Prometheus does, so an Alertmanager that
restarted has them again within one interval and they expire if the forwarder stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import aiohttp
from nats.aio.msg import Msg

from ops.forwarder.conditions import AmAlert, Conditions
from ops.kit.alerts import raise_if_cancelled
from ops.kit.redact import log, redact

RETRY_STATUSES = frozenset({408, 425, 429})
# A firing alert's endsAt is this many resend intervals ahead (Prometheus: 4).
RESEND_HOLD = 4
# Longest sleep between two `in_progress` of held messages; well under the ack wait.
_KEEPALIVE_S = 10.0


@dataclass(eq=False)
class Pending:
    """A stream message waiting for `waiting` targets; `done` runs when none is left."""

    seq: int
    msg: Msg
    waiting: int
    done: Callable[[Pending], Awaitable[None]]

    async def finish(self) -> None:
        self.waiting -= 1
        if self.waiting == 0:
            await self.done(self)


@dataclass(frozen=True)
class Item:
    pending: Pending
    alerts: tuple[AmAlert, ...] = ()  # Alertmanager: rendered when sent
    body: Any = None  # webhook: the payload as is


@dataclass(frozen=True)
class Backoff:
    initial_s: float
    max_s: float


@dataclass(eq=False)
class Target:
    url: str
    backoff: Backoff
    max_queue: int
    queue: deque[Item] = field(default_factory=deque)
    delivered: int = 0
    refused: int = 0
    dropped: int = 0
    up: bool = True  # its last delivery went through (or was refused: it answered)
    _wake: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def name(self) -> str:
        return redact(self.url)

    async def put(self, item: Item) -> None:
        if len(self.queue) >= self.max_queue:
            oldest = self.queue.popleft()
            self.dropped += 1
            log.warning(
                "%s: queue full (%d), dropped the oldest alert (%d dropped so far)",
                self.name, self.max_queue, self.dropped,
            )  # fmt: skip
            await oldest.pending.finish()
        self.queue.append(item)
        self._wake.set()

    def _take(self) -> list[Item]:
        return [self.queue.popleft()]

    def _held(self, items: list[Item]) -> list[Msg]:
        return [i.pending.msg for i in (*items, *self.queue)]

    def _body(self, items: list[Item]) -> Callable[[], Any]:
        body = items[0].body
        return lambda: body

    async def _idle(self, http: aiohttp.ClientSession) -> float | None:
        """Work to do while nothing is queued; returns how long to wait at most."""
        return None

    async def run(self, http: aiohttp.ClientSession) -> None:
        while True:
            raise_if_cancelled()
            wait = await self._idle(http)
            if not self.queue:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=wait)
                continue
            items = self._take()
            if await self.post(http, self._body(items), partial(self._held, items)):
                self.delivered += len(items)
            for item in items:
                await item.pending.finish()

    async def post(
        self,
        http: aiohttp.ClientSession,
        body: Callable[[], Any],
        held: Callable[[], Iterable[Msg]] = tuple,
    ) -> bool:
        """POST until taken (True) or refused (False); retries everything else. The
        body is made afresh for each try (an Alertmanager `endsAt` is relative to now)."""
        delay = self.backoff.initial_s
        while True:
            await _hold(held)  # a POST may take `http_timeout_s`: no redelivery meanwhile
            try:
                async with http.post(self.url, json=body()) as resp:
                    if resp.status < 300:
                        self.up = True
                        return True
                    text = (await resp.text())[:200]
                    if resp.status < 500 and resp.status not in RETRY_STATUSES:
                        self.refused += 1
                        self.up = True
                        log.error("%s refused the alerts (%d %s); skipped",
                                  self.name, resp.status, text)  # fmt: skip
                        return False
                    problem = f"{resp.status} {text}"
            except (aiohttp.ClientError, TimeoutError) as exc:
                problem = str(exc) or type(exc).__name__
            self.up = False
            log.warning("delivery to %s failed (%s); retrying in %.1f s",
                        self.name, problem, delay)  # fmt: skip
            await _sleep_holding(delay * random.uniform(0.8, 1.2), held)
            delay = min(delay * 2, self.backoff.max_s)


async def _hold(held: Callable[[], Iterable[Msg]]) -> None:
    """Tell JetStream the held messages are still being worked on (its ack wait anew)."""
    for msg in held():
        with contextlib.suppress(Exception):
            await msg.in_progress()


async def _sleep_holding(seconds: float, held: Callable[[], Iterable[Msg]]) -> None:
    """Sleep, telling JetStream the held messages (those in hand and those queued
    behind them) are still being worked on, so it does not hand them out again."""
    deadline = time.monotonic() + seconds
    while True:
        await _hold(held)
        left = deadline - time.monotonic()
        if left <= 0:
            return
        await asyncio.sleep(min(left, _KEEPALIVE_S))


@dataclass(eq=False)
class WebhookTarget(Target):
    pass


@dataclass(eq=False)
class AlertmanagerTarget(Target):
    conditions: Conditions = field(default_factory=Conditions)
    resend_s: float = 60.0
    batch: int = 100
    resent: int = 0
    _next_resend: float = 0.0  # monotonic; 0: at once (a start re-establishes them)

    @property
    def name(self) -> str:
        return redact(self.url.removesuffix("/api/v2/alerts"))

    def _hold_ms(self) -> int:
        return int(RESEND_HOLD * self.resend_s * 1000)

    def _take(self) -> list[Item]:
        items: list[Item] = []
        while self.queue and len(items) < self.batch:
            items.append(self.queue.popleft())
        return items

    def _body(self, items: list[Item]) -> Callable[[], Any]:
        def body() -> list[dict[str, Any]]:
            now = int(time.time() * 1000)
            return [a.api_v2(now, self._hold_ms()) for i in items for a in i.alerts]

        return body

    def _firing(self) -> list[dict[str, Any]]:
        now = int(time.time() * 1000)
        return [a.api_v2(now, self._hold_ms()) for a in self.conditions.firing()]

    async def _idle(self, http: aiohttp.ClientSession) -> float | None:
        now = time.monotonic()
        if now >= self._next_resend:
            self._next_resend = now + self.resend_s
            if any(True for _ in self.conditions.firing()) and await self.post(
                http, self._firing, partial(self._held, [])
            ):
                self.resent += 1
        return max(0.0, self._next_resend - time.monotonic())
