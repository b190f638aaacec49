"""The recent-alerts feed behind the web console: the last alerts seen on the bus, each
with a sequence number, so a page polls `after=<seq>` for what is new. Every replica
keeps its own (fed from NATS, not only from what it published itself).

Use alerts (SPEC §10: unbooked and foreign use, idleness) come from what hosts and
their workloads do, in bursts; node, device and reservation alerts are what an
operator or tenant must act on. The feed ranks them (issue 32): use alerts have a
quota of their own, both in what it keeps and in each answer, so no number of them
pushes a `device.unhealthy` or `reservation.atRisk` out of the feed."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from coordinator.api.http.idle_book import IdleBook
from shared.wire import USE_KINDS, Alert

# Of each answer's `limit`, at most this many use alerts (the rest is other kinds'
# first, and use alerts fill what they leave).
USE_SHARE = 0.25


@dataclass(frozen=True, slots=True)
class FedAlert:
    seq: int
    alert: Alert


class AlertFeed:
    def __init__(self, keep: int = 500, keep_use: int = 100) -> None:
        self._items: deque[FedAlert] = deque(maxlen=keep)
        self._use: deque[FedAlert] = deque(maxlen=keep_use)
        self._seq = 0
        # The open idle conditions, whatever the ring above has dropped (issue 34).
        self.idle = IdleBook()

    def add(self, alert: Alert) -> None:
        self._seq += 1
        kept = self._use if alert.kind in USE_KINDS else self._items
        kept.append(FedAlert(self._seq, alert))
        self.idle.note(alert)

    @property
    def last_seq(self) -> int:
        return self._seq

    def after(self, seq: int, limit: int = 100) -> list[FedAlert]:
        """Alerts newer than `seq`, oldest first, at most `limit`: the newest use alerts
        up to their share, the newest of the other kinds, then use alerts again in
        whatever room the others left."""
        other = [item for item in self._items if item.seq > seq]
        use = [item for item in self._use if item.seq > seq]
        quota = int(limit * USE_SHARE)
        other = other[-(limit - min(quota, len(use))) :] if limit > 0 else []
        room = limit - len(other)
        use = use[-room:] if room > 0 else []
        return sorted(other + use, key=lambda item: item.seq)
