"""The recent-alerts feed behind the web console: the last alerts seen on the bus, each
with a sequence number, so a page polls `after=<seq>` for what is new. Every replica
keeps its own (fed from NATS, not only from what it published itself)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from shared.wire import Alert


@dataclass(frozen=True, slots=True)
class FedAlert:
    seq: int
    alert: Alert


class AlertFeed:
    def __init__(self, keep: int = 500) -> None:
        self._items: deque[FedAlert] = deque(maxlen=keep)
        self._seq = 0

    def add(self, alert: Alert) -> None:
        self._seq += 1
        self._items.append(FedAlert(self._seq, alert))

    @property
    def last_seq(self) -> int:
        return self._seq

    def after(self, seq: int, limit: int = 100) -> list[FedAlert]:
        """Alerts newer than `seq`, oldest first, at most `limit` (the newest ones)."""
        newer = [item for item in self._items if item.seq > seq]
        return newer[-limit:]
