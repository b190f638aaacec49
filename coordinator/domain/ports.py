"""Protocols at the coordinator's seams that the domain and tasks depend on."""

from __future__ import annotations

from typing import Protocol

from shared.wire import Alert


class AlertSink(Protocol):
    async def publish(self, alert: Alert) -> None: ...


class Publisher(Protocol):
    async def publish(self, subject: str, payload: bytes) -> None: ...
