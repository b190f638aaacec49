"""Bounded shutdown: each part of the coordinator is stopped within a time limit.

A part that stops answering while it is being stopped (a database or NATS server gone
silent mid-close, a handler that never returns) must not keep the process from exiting:
systemd would kill it after `TimeoutStopSec`, and every later step (the loops' last
flush, the bus drain, the database's pool) would never run. A step that overruns is
named in the log at error, cancelled, and shutdown goes on with the next one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)

STEP_TIMEOUT_S = 15.0
# What a cancelled step gets to unwind before shutdown moves on without it.
CANCEL_GRACE_S = 2.0


def bounded(
    name: str, stop: Callable[[], Awaitable[None]], timeout_s: float = STEP_TIMEOUT_S
) -> Callable[[], Awaitable[None]]:
    """`stop`, as an exit-stack callback that gives up after `timeout_s`."""

    async def step() -> None:
        async def run() -> None:
            await stop()

        task = asyncio.create_task(run(), name=f"gpufleet:stop:{name}")
        done, _ = await asyncio.wait({task}, timeout=timeout_s)
        if task in done:
            task.result()
            return
        log.error("shutdown: %s did not finish within %.0f s; going on without it", name, timeout_s)
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=CANCEL_GRACE_S)
        if task in done and not task.cancelled() and task.exception() is not None:
            log.error("shutdown: %s failed when cancelled: %r", name, task.exception())

    return step
