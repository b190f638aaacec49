"""Warnings that a flood must not turn into a log flood: at most one line per key per
period, saying how many were held back since the last one.

Used for what one bad host or a slow consumer can repeat thousands of times a second
(dropped messages, NATS errors, clamped intervals) and for an agent whose NATS user may
not publish what it tries; counters beside each use (the coordinator's metrics, the
agent's heartbeat) keep the exact numbers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable


class LogThrottle:
    def __init__(
        self,
        logger: logging.Logger,
        every_s: float = 10.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = logger
        self._every_s = every_s
        self._monotonic = monotonic
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def warning(self, key: str, msg: str, *args: object) -> None:
        self._emit(logging.WARNING, key, msg, *args)

    def error(self, key: str, msg: str, *args: object) -> None:
        """For what needs a person (refused credentials): the same throttle, at ERROR."""
        self._emit(logging.ERROR, key, msg, *args)

    def _emit(self, level: int, key: str, msg: str, *args: object) -> None:
        now = self._monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self._every_s:
            self._held[key] = self._held.get(key, 0) + 1
            return
        self._last[key] = now
        held = self._held.pop(key, 0)
        if held:
            msg, args = msg + " (and %d more like it since)", (*args, held)
        self._log.log(level, msg, *args)
