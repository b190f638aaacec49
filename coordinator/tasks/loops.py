"""Named periodic loops: started together, log-and-continue per iteration, cancelled and
awaited on shutdown. No fire-and-forget tasks anywhere in the coordinator.

An iteration that failed because something it needs is away (`Unavailable`: the
database dropped its connections, this replica lost the lead) is counted and logged as
one warning line per loop per period, not a traceback per iteration."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from coordinator.domain.errors import Unavailable
from procs.log_throttle import LogThrottle

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LoopSpec:
    name: str
    interval_s: float
    body: Callable[[], Awaitable[None]]
    # Runs the body only while this says so (the leader-only loops).
    when: Callable[[], bool] | None = None


class Loops:
    def __init__(self) -> None:
        self._specs: list[LoopSpec] = []
        self._tasks: list[asyncio.Task[None]] = []
        self.failures: dict[str, int] = {}
        self._throttle = LogThrottle(log)

    def add(
        self,
        name: str,
        interval_s: float,
        body: Callable[[], Awaitable[None]],
        when: Callable[[], bool] | None = None,
    ) -> None:
        self._specs.append(LoopSpec(name, interval_s, body, when))

    async def _run(self, spec: LoopSpec) -> None:
        me = asyncio.current_task()
        while True:
            try:
                if spec.when is None or spec.when():
                    await spec.body()
            except asyncio.CancelledError:
                raise
            except Unavailable as exc:
                self.failures[spec.name] = self.failures.get(spec.name, 0) + 1
                self._throttle.warning(spec.name, "loop %s: %s; continuing", spec.name, exc)
            except Exception:
                self.failures[spec.name] = self.failures.get(spec.name, 0) + 1
                log.exception("loop %s failed; continuing", spec.name)
            if me is not None and me.cancelling():
                # Stopped, but the body swallowed the cancel (3.11's `asyncio.wait_for`
                # returns normally when its awaitable completes as the cancel arrives).
                raise asyncio.CancelledError
            await asyncio.sleep(spec.interval_s)

    def start(self) -> None:
        for spec in self._specs:
            self._tasks.append(asyncio.create_task(self._run(spec), name=f"gpufleet:{spec.name}"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
