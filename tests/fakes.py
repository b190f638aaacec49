"""The test doubles the coordinator's tests share, declared once: an alert sink and a bus
publisher that keep what they are given. (The simulated NVML, the fake sysfs tree and
the fake clocks ship with the code they stand in for.)"""

from __future__ import annotations

from shared.wire import Alert


class RecordingAlerts:
    """An alert sink (`services.alerting.AlertSink`): keeps every alert it is given."""

    def __init__(self) -> None:
        self.alerts: list[Alert] = []

    async def publish(self, alert: Alert) -> None:
        self.alerts.append(alert)

    def kinds(self) -> list[str]:
        return [a.kind for a in self.alerts]


class RecordingPublisher:
    """A bus publisher: keeps every (subject, payload) it is asked to send."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []

    async def publish(self, subject: str, payload: bytes) -> None:
        self.sent.append((subject, payload))
