"""A broadcast "capacity may have freed up" signal, for requests that wait for capacity
(`wait.timeoutMs`): releases, expiries and node recoveries notify; waiters wake and try
again."""

from __future__ import annotations

import asyncio


class CapacitySignal:
    def __init__(self) -> None:
        self._event = asyncio.Event()

    def notify(self) -> None:
        event, self._event = self._event, asyncio.Event()
        event.set()

    async def wait(self, timeout_s: float) -> bool:
        """True when notified, False on timeout."""
        try:
            await asyncio.wait_for(self._event.wait(), timeout=max(0.0, timeout_s))
        except TimeoutError:
            return False
        return True
