"""What a handler receives: the caller, the resolved pool (for pool-scoped methods) and
the coordinator's services, with the workflows its write methods call. Defined apart
from the server so handlers never see aiohttp."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from coordinator.api.http.alert_feed import AlertFeed
from coordinator.api.http.render import INTERVAL_ANSWERS, RESERVATION_ANSWERS
from coordinator.domain.gpu_use_book import GpuUseBook
from coordinator.domain.model import Pool, Principal
from coordinator.domain.node_fit import BusyUnits
from coordinator.domain.ports import AlertSink
from coordinator.domain.rate_card import RateCard
from coordinator.ledger import Ledger
from coordinator.runtime.metrics import Metrics
from coordinator.services.capacity_signal import CapacitySignal
from coordinator.services.intervals import IntervalBookings
from coordinator.services.maintenance import Maintenance
from coordinator.services.node_identity import NodeIdentity
from coordinator.services.pools import Pools
from coordinator.services.reservations import Reservations, nothing_busy
from coordinator.services.shapes import Shapes
from coordinator.services.tenancy import Tenancy
from shared.clock import Clock
from shared.wire import Alert


def _never_idle(reservation_id: str) -> int | None:
    return None


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
    feed: AlertFeed = field(default_factory=AlertFeed)
    # What each node's GPUs run (`services.gpu_use_watch`), for nodes.get and the console.
    gpu_use: GpuUseBook = field(default_factory=GpuUseBook)
    # The GPUs in unbooked use now, as this replica last saw them (`GpuUseWatch.unbooked`):
    # the placer takes them last.
    busy: Callable[[], BusyUnits] = nothing_busy
    # Since when a reservation's GPUs all idle, as this replica's use join last saw it
    # (`GpuUseWatch.idle_since`; the leader's), for reservations.get/list.
    idle_since: Callable[[str], int | None] = _never_idle
    # Prices for chargeback (`domain.rate_card`); None: exports carry quantities only.
    rate_card: RateCard | None = None

    # One create workflow for the process: it owns the group commit of creates, which
    # the wiring drains on shutdown (`close`).
    reservations: Reservations = field(init=False)

    def __post_init__(self) -> None:
        reservations = Reservations(
            self.ledger, self.clock, self.alerts, self.capacity, RESERVATION_ANSWERS,
            self.notice_ms, busy=self.busy,
        )  # fmt: skip
        object.__setattr__(self, "reservations", reservations)

    async def close(self) -> None:
        """Wait for the create batches being written (after the HTTP server stopped)."""
        await self.reservations.close()

    @property
    def intervals(self) -> IntervalBookings:
        return IntervalBookings(self.ledger, self.clock, self.capacity, INTERVAL_ANSWERS)

    @property
    def maintenance(self) -> Maintenance:
        return Maintenance(self.ledger, self.clock, self.alerts, self.capacity)

    @property
    def shapes(self) -> Shapes:
        return Shapes(self.ledger, self.clock, self.alerts, self.capacity)

    @property
    def node_identity(self) -> NodeIdentity:
        return NodeIdentity(self.ledger, self.clock, self.alerts, self.capacity)

    @property
    def tenancy(self) -> Tenancy:
        return Tenancy(self.ledger, self.clock)

    @property
    def pools(self) -> Pools:
        return Pools(self.ledger, self.clock)


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
