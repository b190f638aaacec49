"""The alert stream as the forwarder reads it: a durable pull consumer that is bound,
or created when missing (at start, and again whenever it disappears, say deleted by
hand), and a read of the stream's history that rebuilds which conditions are firing.

Nothing here raises a NATS or JetStream error to its caller: a poll that times out
(nats-py 2.16 raises a bare `asyncio.TimeoutError` as well as its own) is an empty
poll, and any other error is logged at warning and retried after checking that the
consumer still exists.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from ops.kit.redact import log

RETRY_S = 1.0


@dataclass(frozen=True)
class ConsumerSpec:
    stream: str
    subject: str
    durable: str
    ack_wait_s: float
    max_ack_pending: int


class AlertSource:
    def __init__(
        self,
        js: JetStreamContext,
        spec: ConsumerSpec,
        *,
        wait_s: float,
        history_js: JetStreamContext | None = None,
    ) -> None:
        self.js = js
        # The history read gives up sooner: a user not allowed an ephemeral consumer
        # sees its request time out (a permission violation is not an answer), and the
        # forwarder waits for it before it forwards anything.
        self.history_js = history_js or js
        self.spec = spec
        self.wait_s = wait_s
        self.recreated = 0
        self.errors = 0
        self._sub: JetStreamContext.PullSubscription | None = None
        # The stream sequence to start a recreated consumer at: the oldest message
        # this process has not finished with, else the one after the last it saw.
        self.resume_from: Callable[[], int | None] = lambda: None

    def _config(self, start: int | None) -> ConsumerConfig:
        return ConsumerConfig(
            durable_name=self.spec.durable,
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL if start is None else DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=start,
            ack_wait=self.spec.ack_wait_s,
            max_ack_pending=self.spec.max_ack_pending,
            filter_subject=self.spec.subject,
        )

    async def bind(self) -> None:
        """Bind the durable consumer, creating it when it does not exist; retries until
        it succeeds (the stream may not exist yet, NATS may be down)."""
        while True:
            raise_if_cancelled()
            try:
                await self._bind()
                return
            except (nats.errors.Error, TimeoutError) as exc:
                self.errors += 1
                log.warning("binding consumer %s on %s failed (%s); retrying",
                            self.spec.durable, self.spec.stream, _text(exc))  # fmt: skip
                await asyncio.sleep(RETRY_S)

    async def _bind(self) -> None:
        try:
            await self.js.consumer_info(self.spec.stream, self.spec.durable)
            if self._sub is not None:
                return  # still there: the subscription we have keeps working
        except nats.js.errors.NotFoundError:
            start = self.resume_from()
            await self.js.add_consumer(self.spec.stream, self._config(start))
            if self._sub is not None:
                self.recreated += 1
                log.warning(
                    "consumer %s on %s was missing; recreated it from %s",
                    self.spec.durable, self.spec.stream,
                    "the first message" if start is None else f"stream sequence {start}",
                )  # fmt: skip
            else:
                log.info("consumer %s on %s created", self.spec.durable, self.spec.stream)
        old, self._sub = (
            self._sub,
            await self.js.pull_subscribe_bind(self.spec.durable, self.spec.stream),
        )
        if old is not None:
            with contextlib.suppress(Exception):
                await old.unsubscribe()

    async def fetch(self, batch: int) -> list[Msg]:
        """Up to `batch` messages, or none after `wait_s`; never raises a NATS error."""
        assert self._sub is not None, "bind first"
        try:
            return await self._sub.fetch(batch, timeout=self.wait_s)
        except TimeoutError:
            return []  # nothing new (nats' TimeoutError is an asyncio.TimeoutError too)
        except nats.errors.Error as exc:
            self.errors += 1
            log.warning("fetching alerts from %s failed (%s); retrying",
                        self.spec.durable, _text(exc))  # fmt: skip
        await asyncio.sleep(RETRY_S)
        # The usual cause of a lasting error: the consumer is gone (503, no responders).
        try:
            await self._bind()
        except (nats.errors.Error, TimeoutError) as exc:
            log.warning("checking consumer %s failed (%s); retrying",
                        self.spec.durable, _text(exc))  # fmt: skip
        return []

    async def hand_back(self, batch: int) -> list[Msg]:
        """Stopping: what the last pull still brings, to be handed back with the rest. A
        pull cut short by the stop stays open on the server until it expires
        (`wait_s`), and what it delivers meanwhile would otherwise wait out the ack wait
        before anyone gets it."""
        late: list[Msg] = []
        if self._sub is None:
            return late
        # Past the deadline, that pull has expired: nothing more is on its way.
        deadline = time.monotonic() + self.wait_s + 0.2
        while time.monotonic() < deadline:
            try:
                late += await self._sub.fetch(batch, timeout=0.2)
            except TimeoutError:
                continue
            except nats.errors.Error:
                break
        return late

    async def history(self, apply: Callable[[Msg], Any], attempts: int = 2) -> int | None:
        """Feed every message the stream holds now to `apply`, through an ephemeral
        consumer; returns how many, or None when the history could not be read (after
        `attempts` tries: say, a NATS user that may not create one). Forwarding goes on
        without it; what fired before then is re-sent only once it changes."""
        for attempt in range(1, attempts + 1):
            raise_if_cancelled()
            try:
                return await self._history(apply)
            except (nats.errors.Error, TimeoutError) as exc:
                self.errors += 1
                log.warning("reading the history of %s failed (%s)%s", self.spec.stream,
                            _text(exc), "; retrying" if attempt < attempts else
                            "; going on without it: conditions that fired before this"
                            " start are not re-sent until they change")  # fmt: skip
                if attempt < attempts:
                    await asyncio.sleep(RETRY_S)
        return None

    async def _history(self, apply: Callable[[Msg], Any]) -> int:
        info = await self.history_js.stream_info(self.spec.stream)
        last = info.state.last_seq
        if info.state.messages == 0:
            return 0
        # Unnamed, so the server names it: the one create subject a NATS user limited
        # to ephemeral consumers may use ($JS.API.CONSUMER.CREATE.<stream>).
        consumer = await self.history_js.add_consumer(
            self.spec.stream,
            ConsumerConfig(
                ack_policy=AckPolicy.NONE,
                deliver_policy=DeliverPolicy.ALL,
                filter_subject=self.spec.subject,
                inactive_threshold=30.0,
                mem_storage=True,
            ),
        )
        sub = await self.history_js.pull_subscribe_bind(consumer.name, self.spec.stream)
        count = 0
        try:
            while True:
                raise_if_cancelled()
                try:
                    msgs = await sub.fetch(500, timeout=2)
                except TimeoutError:
                    return count  # fewer than `last` left: expired meanwhile
                for msg in msgs:
                    apply(msg)
                    count += 1
                    if msg.metadata.sequence.stream >= last:
                        return count
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()


def raise_if_cancelled() -> None:
    """Python 3.11's `wait_for` can swallow a cancellation that lands as its inner
    future completes (fixed in 3.12); a loop that polls with short timeouts checks for
    a pending one itself, so a stop is never lost."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def _text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
