"""Protocols at the coordinator's seams that the domain and tasks depend on."""

from __future__ import annotations

from typing import Protocol

from shared.wire import Alert


class AlertSink(Protocol):
    async def publish(self, alert: Alert) -> None: ...


class Publisher(Protocol):
    async def publish(self, subject: str, payload: bytes) -> None: ...


class Heap(Protocol):
    """What the process does with its heap when a pool cache is reloaded and when the
    caches go (`coordinator.runtime.heap`)."""

    def reloaded(self, now: int) -> None: ...

    def release(self) -> None: ...
