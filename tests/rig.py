"""The write workflows wired on a real ledger with a fake clock and a recording alert
sink (no NATS, no socket), several pools of one tenant, and PostgreSQL lock helpers that
let a test hold a writer in the middle of its transaction to force an interleaving."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from sqlalchemy import text

from coordinator.api.http.render import INTERVAL_ANSWERS, RESERVATION_ANSWERS
from coordinator.api.shapes.reservation_input import ReservationCreateInput
from coordinator.domain.intervals import format_time
from coordinator.domain.model import RollupRow
from coordinator.ledger import Ledger
from coordinator.services.capacity_signal import CapacitySignal
from coordinator.services.intervals import IntervalBookings
from coordinator.services.maintenance import Maintenance
from coordinator.services.node_records import record_inventory
from coordinator.services.reservations import CreateRequest, Reservations
from shared.clock import FakeClock
from shared.ids import new_pool_id
from tests.database import database
from tests.factories import make_inventory
from tests.fakes import RecordingAlerts

HOUR = 3_600_000
Q = 900_000
TENANT = "acme"


class Rig:
    def __init__(self, ledger: Ledger, clock: FakeClock) -> None:
        self.ledger, self.clock = ledger, clock
        self.alerts = RecordingAlerts()
        self.capacity = CapacitySignal()
        self.reservations = Reservations(
            ledger, clock, self.alerts, self.capacity, RESERVATION_ANSWERS, notice_ms=60_000
        )
        self.intervals = IntervalBookings(ledger, clock, self.capacity, INTERVAL_ANSWERS)
        self.maintenance = Maintenance(ledger, clock, self.alerts, self.capacity)

    @classmethod
    async def open(cls, ledger: Ledger) -> Rig:
        clock = FakeClock()
        await ledger.tenants.create(TENANT, "Acme", clock.now_ms())
        return cls(ledger, clock)

    async def pool(self, nodes: int = 1, gpus: int = 8, memory_gib: int = 512) -> str:
        pool_id = new_pool_id()
        now = self.clock.now_ms()
        await self.ledger.pools.create(pool_id, "p", TENANT, None, now)
        for i in range(nodes):
            inv = make_inventory(f"{pool_id[-6:]}-n{i}", pool_id, gpus=gpus, memory_gib=memory_gib)
            await record_inventory(self.ledger, inv, now)
        return pool_id

    def request(self, pool_id: str, key: str, *, gpus: int = 1, **extra: Any) -> CreateRequest:
        """A create as the API builds it from a body."""
        body = ReservationCreateInput.model_validate(
            {
                "tenantId": TENANT,
                "poolId": pool_id,
                "devices": [{"class": "gpu", "count": gpus}],
                "duration": "1h",
                "idempotencyKey": key,
            }
            | extra
        )
        return CreateRequest(
            tenant_id=body.tenant_id,
            pool_id=body.pool_id,
            project_id=None,
            placement=body.placement(),
            start=body.start,
            duration_ms=body.duration_ms,
            lease_seconds=body.lease_seconds,
            resources=body.resources.as_dict() if body.resources else {},
            gang=None,
            idempotency_key=body.idempotency_key,
            canonical=body.canonical(),
        )

    def quarters(self, first: int, gb: int, count: int = 1) -> dict[str, Any]:
        """An interval body: `count` quarters from the `first`-th quarter after now + 1 h."""
        now = self.clock.now_ms()
        base = now - now % Q + HOUR + first * Q
        return {
            "intervals": [
                {
                    "startsAt": format_time(base + k * Q),
                    "endsAt": format_time(base + (k + 1) * Q),
                    "capacityGb": gb,
                }
                for k in range(count)
            ]
        }

    async def row(self, pool_id: str, resource: str) -> RollupRow:
        rows = (await self.ledger.rollup([pool_id]))[pool_id]
        return next(r for r in rows if r.resource == resource)


async def waiting_on_locks(url: str, count: int, patience_s: float = 10.0) -> None:
    """Until `count` backends of this PostgreSQL database wait on a lock."""
    async with database(url) as db:
        deadline = asyncio.get_running_loop().time() + patience_s
        while True:
            async with db.read() as conn:
                waiting = (
                    await conn.execute(
                        text(
                            "SELECT count(*) FROM pg_stat_activity "
                            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
                        )
                    )
                ).scalar_one()
            if waiting >= count:
                return
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"{waiting} backends wait on locks, expected {count}")
            await asyncio.sleep(0.02)


@asynccontextmanager
async def rollup_rows_held(url: str, *pool_ids: str) -> AsyncIterator[None]:
    """Hold the pools' rollup rows (PostgreSQL row locks) until the block ends: a writer
    that has written its bookings waits there, before it commits."""
    async with database(url) as db, db.transaction() as conn:
        await conn.execute(
            text("SELECT 1 FROM rollup WHERE pool_id = ANY(:ids) FOR UPDATE"),
            {"ids": list(pool_ids)},
        )
        yield
