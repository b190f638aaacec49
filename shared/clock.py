"""Time as a dependency, for the agent and the coordinator alike: the `Clock` protocol,
the system clock, and a fake that moves only when a test says so.

Code that needs the time takes it from a `Clock` rather than calling `time` itself, so
that tests drive hysteresis, leases and expiry without sleeping.
"""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["Clock", "FakeClock", "SystemClock"]


class Clock(Protocol):
    def now_ms(self) -> int:
        """Milliseconds since the epoch: timestamps on the wire and in the ledger."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never jumps, for hold-down, recovery and pacing timers."""
        ...


class SystemClock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic(self) -> float:
        return time.monotonic()


class FakeClock:
    """A clock that moves only when told to; its two readings move together."""

    def __init__(self, start_ms: int = 1_767_225_600_000) -> None:
        self._now = start_ms

    def now_ms(self) -> int:
        return self._now

    def monotonic(self) -> float:
        return self._now / 1000

    def advance(self, ms: int) -> None:
        self._now += ms

    def set(self, ms: int) -> None:
        self._now = ms
