"""The clock seam: wall time for timestamps on the wire, monotonic time for health timers.

Health and scheduling take `now` from here rather than calling `time` themselves so that
tests can drive hysteresis with a fake clock instead of sleeping.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def wall_ms(self) -> int:
        """Milliseconds since the epoch, for `sentAt` fields."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never jumps, for hold-down and recovery timers."""
        ...


class SystemClock:
    def wall_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic(self) -> float:
        return time.monotonic()
