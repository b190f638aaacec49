"""What a handler receives: the caller, the resolved pool (for pool-scoped methods) and
the coordinator's services. Defined apart from the server so handlers never see aiohttp."""

from __future__ import annotations

from dataclasses import dataclass, field

from coordinator.capacity_signal import CapacitySignal
from coordinator.domain.clock import Clock
from coordinator.domain.model import Pool, Principal
from coordinator.domain.ports import AlertSink
from coordinator.ledger import Ledger
from coordinator.metrics import Metrics
from shared.wire import Alert


class _NoAlerts:
    async def publish(self, alert: Alert) -> None:
        return None


@dataclass(frozen=True, slots=True)
class Services:
    ledger: Ledger
    clock: Clock
    alerts: AlertSink = field(default_factory=_NoAlerts)
    capacity: CapacitySignal = field(default_factory=CapacitySignal)
    notice_ms: int = 120_000
    metrics: Metrics = field(default_factory=Metrics)


@dataclass(frozen=True, slots=True)
class CallContext:
    principal: Principal
    services: Services
    pool: Pool | None = None

    @property
    def ledger(self) -> Ledger:
        return self.services.ledger

    def now(self) -> int:
        return self.services.clock.now_ms()

    def require_pool(self) -> Pool:
        assert self.pool is not None, "pool-scoped method without a resolved pool"
        return self.pool
