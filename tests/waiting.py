"""Polling helper for tests that wait on real processes and servers."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable


async def eventually(check: Callable[[], Awaitable[bool]], within_s: float = 10.0) -> None:
    """Poll `check` until it is true; fail the test after `within_s` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while not await check():
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {within_s}s")
        await asyncio.sleep(0.05)
