"""The alert stream as the forwarder reads it: a durable pull consumer that is bound,
or created when missing (at start, and again whenever it disappears, say deleted by
hand), and a read of the stream's history that rebuilds which conditions are firing.

The consumer is created under its own name (`$JS.API.CONSUMER.CREATE.<stream>.<name>`,
the only create subjects its NATS user has), and its config is checked against ours at
bind and every `check_every_s`: one changed behind our back (another filter, an
inactivity threshold, pushed elsewhere) would silently forward nothing, so a difference
is logged at ERROR, counted (`mismatches`, and `on_mismatch` for a metric) and set back;
one that cannot be set back (push or another ack policy) raises `ConsumerConflict`,
which stops the process. The history comes by direct get (`ops.kit.stream_reader`), as
a reader reads it: no other consumer.

A consumer that holds messages for us and hands none over is as good as a dead link
(`stalled`, asked after pulls that brought nothing; the forwarder then reconnects as
its link probe would).

Nothing else here raises a NATS or JetStream error to its caller: a poll that times out
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
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from ops.kit.errors import OpsError
from ops.kit.redact import log
from ops.kit.stream_reader import StoredMsg, read_stream

RETRY_S = 1.0
CHECK_EVERY_S = 30.0


class ConsumerConflict(OpsError):
    """Our durable consumer exists with a config we cannot set back (a push consumer, or
    another ack policy) and we may not delete it: an operator must (exit 1)."""

    exit_code = 1
    prog = "gpufleet"


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
        nc: Client,
        spec: ConsumerSpec,
        *,
        wait_s: float,
        api_timeout_s: float = 10.0,
        history_timeout_s: float = 4.0,
        on_mismatch: Callable[[], None] = lambda: None,
    ) -> None:
        self.nc = nc
        self.js = nc.jetstream(timeout=api_timeout_s)
        # The history read gives up sooner: the forwarder waits for it before it
        # forwards anything.
        self.history_timeout_s = history_timeout_s
        self.spec = spec
        self.wait_s = wait_s
        self.recreated = 0
        self.errors = 0
        self.mismatches = 0  # times our consumer was found changed behind our back
        self.on_mismatch = on_mismatch
        self.check_every_s = CHECK_EVERY_S
        self._checked_at = 0.0
        self._sub: JetStreamContext.PullSubscription | None = None
        # The stream sequence to start a recreated consumer at: the oldest message
        # this process has not finished with, else the one after the last it saw.
        self.resume_from: Callable[[], int | None] = lambda: None
        # The stream sequence last delivered, when the consumer last said it held
        # messages for us (`stalled`); None when it held none or we got some since.
        self._stall_mark: int | None = None

    def _config(self, start: int | None) -> ConsumerConfig:
        return ConsumerConfig(
            name=self.spec.durable,
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
            info = await self.js.consumer_info(self.spec.stream, self.spec.durable)
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
        else:
            await self._check(info.config)
            if self._sub is not None:
                return  # still there: the subscription we have keeps working
        self._checked_at = time.monotonic()
        old, self._sub = (
            self._sub,
            await self.js.pull_subscribe_bind(self.spec.durable, self.spec.stream),
        )
        if old is not None:
            with contextlib.suppress(Exception):
                await old.unsubscribe()

    def differences(self, have: ConsumerConfig) -> list[str]:
        """What in `have` differs from the consumer we create (its start aside, which a
        recreation moves on purpose)."""
        spec = self.spec
        wanted: list[tuple[str, Any, Any]] = [
            ("durable_name", have.durable_name, spec.durable),
            ("filter_subject", have.filter_subject, spec.subject),
            ("filter_subjects", have.filter_subjects or None, None),
            ("deliver_subject", have.deliver_subject, None),
            ("deliver_group", have.deliver_group, None),
            ("ack_policy", have.ack_policy, AckPolicy.EXPLICIT),
            ("ack_wait", have.ack_wait, spec.ack_wait_s),
            ("max_ack_pending", have.max_ack_pending, spec.max_ack_pending),
            ("inactive_threshold", have.inactive_threshold or None, None),
            ("max_deliver", have.max_deliver if (have.max_deliver or -1) > 0 else None, None),
            ("sample_freq", have.sample_freq or None, None),
            # Bodiless messages would read as "not an alert" and be acknowledged away.
            ("headers_only", bool(have.headers_only), False),
        ]
        return [f"{name}={got!r} (want {want!r})" for name, got, want in wanted if got != want]

    async def _check(self, have: ConsumerConfig) -> None:
        """ERROR, count and set back a consumer changed behind our back."""
        self._checked_at = time.monotonic()
        differs = self.differences(have)
        if not differs:
            return
        self.mismatches += 1
        self.on_mismatch()
        where = f"consumer {self.spec.durable} on {self.spec.stream}"
        log.error("%s was changed behind our back (%s); setting it back",
                  where, "; ".join(differs))  # fmt: skip
        if have.deliver_subject or have.ack_policy != AckPolicy.EXPLICIT:
            raise ConsumerConflict(
                f"{where} is not ours to use ({'; '.join(differs)}) and cannot be updated;"
                " delete it (`nats consumer rm`) and start again"
            )
        # Where it starts cannot be updated: keep it.
        config = self._config(None)
        config.deliver_policy = have.deliver_policy
        config.opt_start_seq = have.opt_start_seq
        config.opt_start_time = have.opt_start_time
        try:
            fixed = await self.js.add_consumer(self.spec.stream, config)
        except nats.js.errors.APIError as exc:
            raise ConsumerConflict(f"{where}: cannot set it back ({_text(exc)})") from None
        still = self.differences(fixed.config)
        if still:
            raise ConsumerConflict(f"{where}: still differs after setting it back: {still}")
        log.warning("%s set back to our config", where)

    async def fetch(self, batch: int) -> list[Msg]:
        """Up to `batch` messages, or none after `wait_s`; never raises a NATS error."""
        assert self._sub is not None, "bind first"
        try:
            if time.monotonic() - self._checked_at >= self.check_every_s:
                await self._bind()  # checks its config again (ConsumerConflict: stop)
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

    def moving(self) -> None:
        """A pull brought messages: the consumer is not stalled."""
        self._stall_mark = None

    async def stalled(self, timeout_s: float) -> str | None:
        """Why the consumer counts as stalled, or None: asked after pulls that brought
        nothing, it says it holds messages for us (pending, and not held back by our
        unacknowledged ones) and has handed none over since it was last asked
        (`timeout_s`: how long to wait for its answer)."""
        durable = self.spec.durable
        try:
            info = await self.js.consumer_info(self.spec.stream, durable, timeout=timeout_s)
        except (TimeoutError, nats.errors.Error):
            # No answer: the link probe judges our server; JetStream electing a new
            # leader for the consumer answers nothing either, and no move hurries it.
            # Gone or refused: `fetch` rebinds it.
            self._stall_mark = None
            return None
        pending = info.num_pending or 0
        held = pending > 0 and (info.num_ack_pending or 0) < self.spec.max_ack_pending
        mark = info.delivered.stream_seq if held else None
        before, self._stall_mark = self._stall_mark, mark
        if mark is not None and mark == before:
            return f"consumer {durable} holds {pending} alerts and hands none over"
        return None

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

    async def history(self, apply: Callable[[StoredMsg], Any], attempts: int = 2) -> int | None:
        """Feed every message the stream holds now to `apply`, by direct get; returns
        how many, or None when the history could not be read (after `attempts` tries).
        Forwarding goes on without it; what fired before then is re-sent only once it
        changes."""
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

    async def _history(self, apply: Callable[[StoredMsg], Any]) -> int:
        js = self.nc.jetstream(timeout=self.history_timeout_s)
        info = await js.stream_info(self.spec.stream)
        if info.state.messages == 0:
            return 0
        count = 0
        async for msg in read_stream(
            self.nc, self.spec.stream, self.spec.subject,
            upto_seq=info.state.last_seq, timeout_s=self.history_timeout_s,
        ):  # fmt: skip
            raise_if_cancelled()
            apply(msg)
            count += 1
        return count


def raise_if_cancelled() -> None:
    """Python 3.11's `wait_for` can swallow a cancellation that lands as its inner
    future completes (fixed in 3.12); a loop that polls with short timeouts checks for
    a pending one itself, so a stop is never lost."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def _text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
