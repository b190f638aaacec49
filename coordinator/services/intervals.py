"""Interval reservations of pool memory (seed 002) as a workflow: all intervals or none.

The request is checked against the seed's rules, its pool resolved (given, or the
tenant's only visible pool), and what each quarter-hour could take is read before the
pool lock; the unit of work then re-reads under the lock, so an interval that fitted
before but not now lost a race (`concurrent_write`) rather than never fitting
(`insufficient_capacity`). With an `Idempotency-Key` the answer — a refusal included —
is recorded in the same commit and replayed for the same key, body and pool — before
the request is validated again, so a retry after the lead time ran out still gets it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from coordinator.domain.errors import NotFound
from coordinator.domain.idempotency import Recorded, body_hash
from coordinator.domain.intervals import (
    Interval,
    IntervalError,
    IntervalReservation,
    QuarterUsage,
    parse_intervals,
)
from coordinator.domain.model import Pool
from coordinator.ledger import Ledger
from coordinator.services.capacity_signal import CapacitySignal
from coordinator.services.idempotent import Replayed, retrying
from shared.clock import Clock
from shared.ids import POOL_ID_PATTERN

ENDPOINT = "capacity.reservations"
_POOL = re.compile(POOL_ID_PATTERN)


@dataclass(frozen=True, slots=True)
class Shortfall:
    starts_at: int
    requested_gb: int
    reservable_gb: int
    reason: Literal["insufficient_capacity", "concurrent_write"]


@dataclass(frozen=True, slots=True)
class IntervalsBooked:
    reservation: IntervalReservation


@dataclass(frozen=True, slots=True)
class IntervalsRefused:
    shortfalls: tuple[Shortfall, ...]


IntervalOutcome = IntervalsBooked | IntervalsRefused | Replayed


class IntervalAnswers(Protocol):
    """How the API words an outcome, recorded under the key so a replay is verbatim."""

    def booked(self, reservation: IntervalReservation) -> Any: ...

    def refused(self, shortfalls: tuple[Shortfall, ...]) -> Any: ...


async def visible_pool(ledger: Ledger, tenant_id: str, wanted: str | None) -> Pool:
    """The pool named (NOT_FOUND unless the tenant sees it), or the tenant's only live
    visible pool."""
    if wanted is not None:
        if not _POOL.match(wanted):
            raise IntervalError("poolId: not a pool id")
        pool = await ledger.pools.get(wanted)
        if pool is None or not pool.visible_to(tenant_id):
            raise NotFound(f"pool {wanted} not found")
        return pool
    live = [p for p in await ledger.pools.list_visible(tenant_id) if not p.archived]
    if len(live) != 1:
        raise IntervalError(f"poolId is required: tenant {tenant_id} sees {len(live)} pools")
    return live[0]


def request_hash(body: Any, query_pool_id: str | None) -> str:
    """The hashed request: the body, and the pool when the query names it (a body's
    `poolId` is in the body). The same key and body sent to another pool is another
    request, so IDEMPOTENCY_KEY_CONFLICT, never the other pool's answer."""
    if query_pool_id is None:
        return body_hash(body)
    return body_hash({"body": body, "poolId": query_pool_id})


def shortfalls(
    intervals: list[Interval], now: dict[int, QuarterUsage], before: dict[int, QuarterUsage]
) -> tuple[Shortfall, ...]:
    out = []
    for iv in intervals:
        free = now[iv.starts_at].reservable
        if iv.capacity_gb <= free:
            continue
        seen = before.get(iv.starts_at)
        raced = seen is not None and iv.capacity_gb <= seen.reservable
        reason: Literal["insufficient_capacity", "concurrent_write"] = (
            "concurrent_write" if raced else "insufficient_capacity"
        )
        out.append(Shortfall(iv.starts_at, iv.capacity_gb, free, reason))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class IntervalBookings:
    ledger: Ledger
    clock: Clock
    capacity: CapacitySignal
    answers: IntervalAnswers

    async def book(
        self, tenant_id: str, body: Any, pool_id: str | None, key: str | None
    ) -> IntervalOutcome:
        """Book `body`'s intervals for the tenant; IntervalError when the request breaks
        a rule of the seed, NotFound for a pool the tenant does not see.

        A retry with a key is answered from its record before anything is validated: it
        gets the first answer even after the lead time ran out."""
        now = self.clock.now_ms()
        digest = request_hash(body, pool_id)
        if key is not None:
            found = await self.ledger.recorded(tenant_id, ENDPOINT, key, digest)
            if found is not None:
                return Replayed(found.status, found.response)
        intervals = parse_intervals(body, now)
        wanted = pool_id or (body.get("poolId") if isinstance(body, dict) else None)
        if wanted is not None and not isinstance(wanted, str):
            raise IntervalError("poolId: must be a string")
        pool = await visible_pool(self.ledger, tenant_id, wanted)
        quarters = [iv.starts_at for iv in intervals]
        seen = await self.ledger.intervals.reservable(tenant_id, pool.pool_id, quarters)

        async def attempt() -> IntervalOutcome:
            async with self.ledger.transaction() as uow:
                await uow.lock_tenant(tenant_id)
                await uow.lock_pools(pool.pool_id)
                if key is not None:
                    found = await uow.idempotency.lookup(tenant_id, ENDPOINT, key, digest)
                    if found is not None:
                        return Replayed(found.status, found.response)
                current = await uow.intervals.usage(tenant_id, pool.pool_id, quarters)
                short = shortfalls(intervals, current, seen)
                if short:
                    if key is not None:
                        refusal = Recorded(409, self.answers.refused(short))
                        await uow.idempotency.store(tenant_id, ENDPOINT, key, digest, refusal, now)
                        await uow.commit()
                    return IntervalsRefused(short)
                res = await uow.intervals.book(tenant_id, pool.pool_id, intervals, now)
                if key is not None:
                    answer = Recorded(200, self.answers.booked(res))
                    await uow.idempotency.store(tenant_id, ENDPOINT, key, digest, answer, now)
                await uow.commit()
                return IntervalsBooked(res)

        outcome = await retrying(attempt)
        if isinstance(outcome, IntervalsBooked):
            self.capacity.notify()
        return outcome
