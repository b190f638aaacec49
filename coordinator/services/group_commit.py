"""Group commit: requests for one key (a pool) that arrive while a batch of them is being
written join the next batch, so concurrent requests share one transaction and one commit.

The first request for an idle key starts a drain task at once — a lone request waits for
no company — which takes up to `max_batch` waiting requests, hands them to the runner
as one batch, gives each its own outcome (or error) and repeats until none wait. The
runner answers per request; if it fails as a whole, every request of that batch hears
the error (runners fall back to running requests alone before it comes to that).

The drain task runs in the context of the request that started it (context variables
such as the leader fence included). A submitter that is cancelled stops waiting; a
request already in a batch is decided with the others (a retry under its idempotency key
then replays that answer).

Its owner (the reservations workflow) awaits `drain()` on shutdown, so a batch being
written when the HTTP server stops still commits and answers before the ledger closes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

MAX_BATCH = 64


class GroupCommit(Generic[T, R]):
    def __init__(self, max_batch: int = MAX_BATCH) -> None:
        self._max = max_batch
        self._queues: dict[str, list[tuple[T, asyncio.Future[R]]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.batches = 0  # batches run, for tests and benchmarks

    async def submit(
        self, key: str, item: T, run: Callable[[list[T]], Awaitable[list[R | Exception]]]
    ) -> R:
        """`item`'s outcome once a batch with it has run; `run` runs the batch if this
        request starts a drain (one runner per drain)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = []
            task = loop.create_task(self._drain(key, queue, run))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        queue.append((item, future))
        return await future

    async def drain(self) -> None:
        """Return once every drain task running now (and any they leave behind) is done."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _drain(
        self,
        key: str,
        queue: list[tuple[T, asyncio.Future[R]]],
        run: Callable[[list[T]], Awaitable[list[R | Exception]]],
    ) -> None:
        batch: list[tuple[T, asyncio.Future[R]]] = []
        try:
            # No await between finding the queue empty and dropping it below: a request
            # arriving meanwhile either joins this queue or starts a drain of its own.
            while queue:
                batch = [(item, f) for item, f in queue[: self._max] if not f.done()]
                del queue[: self._max]
                if not batch:
                    continue
                self.batches += 1
                try:
                    outcomes = await run([item for item, _ in batch])
                except Exception as exc:
                    outcomes = [exc] * len(batch)
                for (_, future), outcome in zip(batch, outcomes, strict=True):
                    if future.done():
                        continue
                    if isinstance(outcome, Exception):
                        future.set_exception(outcome)
                    else:
                        future.set_result(outcome)
        finally:
            if self._queues.get(key) is queue:
                del self._queues[key]
            # Only when the drain itself is cancelled (the loop shutting down).
            for _, future in batch + queue:
                if not future.done():
                    future.set_exception(RuntimeError("the batch was abandoned"))
