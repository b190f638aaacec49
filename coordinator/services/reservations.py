"""Compute reservations as workflows: create (and its wait for capacity), renew,
extend (move a booking's end), release.

Each attempt to create replays the answer recorded under the idempotency key, or places
and books, or refuses — and records that answer in the same commit as the booking, so a
retry with the same key and body gets exactly the first answer (a 409 included).
Concurrent attempts on one pool share one unit of work (group commit, `group_commit`):
requests that arrive while a batch commits join the next, and each is decided in turn
against what the ones before it booked (`ledger.booking_batch`), with its own answer or
error; a batch that fails as a whole is retried one request at a time, and a request
that must preempt runs alone. With a wait, a request that does not fit tries again
whenever capacity may have freed up, until its deadline. Spot holders noticed by a
booking hear of it by a `reservation.notice` alert, written to the outbox in the
booking's own commit and announced to the alert sink once durable.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from coordinator.domain.booking import Booked, BookingRequest, Deferred, NotPlaced, Preemptible
from coordinator.domain.errors import (
    CapacityNotAvailable,
    CoordinatorError,
    InvalidInput,
    QuotaExceeded,
)
from coordinator.domain.idempotency import Recorded, Stored, body_hash, matching
from coordinator.domain.node_fit import BusyUnits
from coordinator.domain.placement_model import Placement, PlacementRequest
from coordinator.domain.ports import AlertSink
from coordinator.domain.reservation import Reservation
from coordinator.ledger import BookingBatch, Ledger
from coordinator.services import alerting
from coordinator.services.capacity_signal import CapacitySignal
from coordinator.services.group_commit import GroupCommit
from coordinator.services.idempotent import Replayed, retrying
from coordinator.services.node_records import settle_pool_moves
from shared.clock import Clock
from shared.ids import ulid
from shared.wire import Alert

log = logging.getLogger(__name__)

ENDPOINT = "reservations.create"
# A start this far in the past is a clock problem on the client, not "now".
START_SKEW_MS = 5 * 60 * 1000


class ReservationAnswers(Protocol):
    """How the API words an outcome. The words are recorded with the booking, in the same
    unit of work, so that a replay is the first answer verbatim."""

    def created(self, reservation: Reservation, now: int, warnings: Sequence[str] = ()) -> Any: ...

    def refused(self, error: CoordinatorError) -> Any: ...


@dataclass(frozen=True, slots=True)
class CreateRequest:
    tenant_id: str
    pool_id: str
    project_id: str | None
    placement: PlacementRequest
    start: int | None  # None: as soon as it is placed
    duration_ms: int
    lease_seconds: int | None
    resources: dict[str, int]
    gang: dict[str, Any] | None
    idempotency_key: str
    canonical: Any  # the request as hashed for its idempotency key
    wait_ms: int = 0


@dataclass(frozen=True, slots=True)
class Created:
    reservation: Reservation
    victims: tuple[Reservation, ...]
    at: int
    notices: tuple[Alert, ...] = ()  # committed with the booking
    warnings: tuple[str, ...] = ()  # GPUs in unbooked use it took


@dataclass(frozen=True, slots=True)
class Refused:
    """Not booked; `error` (QUOTA_EXCEEDED or CAPACITY_NOT_AVAILABLE) was recorded."""

    error: CoordinatorError


@dataclass(frozen=True, slots=True)
class Current:
    """A reservation as it stands at `at`, after a renew or a release."""

    reservation: Reservation
    at: int


@dataclass(frozen=True, slots=True)
class Moved:
    """A reservation after `extend` (as it would be, for a dry run) and its end before."""

    reservation: Reservation
    at: int
    previous_end: int


CreateOutcome = Created | Refused | Replayed


def resolve_start(start: int | None, now: int) -> int:
    if start is None:
        return now
    if start < now - START_SKEW_MS:
        raise InvalidInput(
            "start is in the past",
            {"fields": [{"path": "start", "message": "start is in the past", "type": "past"}]},
        )
    return max(start, now)


def shortfall_details(placement: Placement) -> dict[str, Any]:
    return {
        "reason": placement.reason,
        "devices": [
            {
                "index": s.index,
                "class": s.cls,
                "requested": s.requested,
                "available": s.available,
                "reason": s.reason,
            }
            for s in placement.shortfalls
        ],
    }


def not_available(placement: Placement, preemptible: Preemptible | None) -> CapacityNotAvailable:
    details = shortfall_details(placement)
    if preemptible:
        details["preemptible"] = {"count": preemptible.count, "startsAt": preemptible.starts_at}
    return CapacityNotAvailable(placement.reason or "the request does not fit", details)


def notices_for(victims: tuple[Reservation, ...], now: int) -> tuple[Alert, ...]:
    """A `reservation.notice` for each spot reservation a booking preempts."""
    return tuple(
        Alert(
            alert_id=ulid(now),
            kind="reservation.notice",
            pool_id=victim.pool_id,
            node_id=victim.atoms[0].node_id if victim.atoms else "-",
            at=now,
            reason="preempted by a regular reservation",
            since=now,
            reservation_id=victim.reservation_id,
            details={"tenantId": victim.tenant_id, "preemptAt": victim.preempt_at},
        )
        for victim in victims
    )


@dataclass(slots=True)
class _Pending:
    """A create waiting for a batch: the request, its body hash, until when (event loop
    time) it may wait for capacity, and the workflow it came through (which words its
    answer; the batch runs on the workflow of the request that started the drain)."""

    req: CreateRequest
    digest: str
    deadline: float
    workflow: Reservations


def _group_commit() -> GroupCommit[_Pending, CreateOutcome | None]:
    return GroupCommit()


def nothing_busy() -> BusyUnits:
    return frozenset()


@dataclass(frozen=True, slots=True)
class Reservations:
    ledger: Ledger
    clock: Clock
    alerts: AlertSink
    capacity: CapacitySignal
    answers: ReservationAnswers
    notice_ms: int
    # The creates waiting for a batch, per pool. One workflow serves the process; a copy
    # made with `dataclasses.replace` (other wording) shares it and batches with it.
    batches: GroupCommit[_Pending, CreateOutcome | None] = field(default_factory=_group_commit)
    # The GPUs in unbooked use now (`GpuUseWatch.unbooked`), read as each request is
    # decided: the placer takes them last.
    busy: Callable[[], BusyUnits] = nothing_busy

    @property
    def batches_run(self) -> int:
        """How many create batches have run (tests and benchmarks read it)."""
        return self.batches.batches

    async def close(self) -> None:
        """Wait for the batches being written: each commits and answers its requests."""
        await self.batches.drain()

    async def create(self, req: CreateRequest) -> CreateOutcome:
        """Book `req` or refuse it, exactly once per idempotency key.

        Concurrent creates of one pool share a unit of work (`_batch`). A retry is
        answered from its record first: it gets the first answer even when the request
        would no longer validate (its start has passed since)."""
        item = _Pending(req, body_hash(req.canonical), 0.0, self)
        loop = asyncio.get_running_loop()
        item.deadline = loop.time() + req.wait_ms / 1000
        while True:
            outcome = await self.batches.submit(req.pool_id, item, self._run_batch)
            if outcome is not None:
                break
            await self.capacity.wait(min(item.deadline - loop.time(), 1.0))
        if isinstance(outcome, Created):
            await alerting.announce(self.alerts, outcome.notices)
        return outcome

    async def _run_batch(self, items: list[_Pending]) -> list[CreateOutcome | Exception | None]:
        try:
            return await self._batch(items)
        except Exception as exc:
            # The batch as a whole failed (a write raced, the database went away, an
            # answer could not be worded): none of it is durable and nobody was answered,
            # so each request runs alone, as it would have without company, and gets its
            # own outcome or error.
            if len(items) > 1:
                log.warning(
                    "a batch of %d creates failed (%s: %s); each runs alone",
                    len(items), type(exc).__name__, exc,
                )  # fmt: skip
        return [await item.workflow.alone_or_error(item) for item in items]

    async def _batch(self, items: list[_Pending]) -> list[CreateOutcome | Exception | None]:
        """One unit of work for requests of one pool: replay, book or refuse each in
        turn against what the ones before it booked, and commit all answers at once.
        One request's refusal or error leaves its neighbours' answers as they are; those
        that must run alone (a preemption, a repeated key) run after the commit."""
        now = self.clock.now_ms()
        out: list[CreateOutcome | Exception | None] = [None] * len(items)
        alone: list[int] = []
        answers: list[tuple[str, str, str, Recorded]] = []
        async with self.ledger.transaction() as uow:
            batch = await uow.booking_batch(
                items[0].req.pool_id, {item.req.tenant_id for item in items}, now
            )
            keys = [(item.req.tenant_id, item.req.idempotency_key) for item in items]
            found = await uow.idempotency.lookup_many(ENDPOINT, keys)
            seen: set[tuple[str, str]] = set()
            for n, (item, key) in enumerate(zip(items, keys, strict=True)):
                if key in seen:
                    # After the first with this key commits, this one replays its answer.
                    alone.append(n)
                    continue
                seen.add(key)
                try:
                    decided = await self._decide(batch, item, found.get(key), now)
                except Exception as exc:
                    out[n] = exc
                    continue
                if isinstance(decided, Deferred):
                    alone.append(n)
                    continue
                # From here an error fails the whole batch: a booking decided must be
                # recorded with its answer or not at all.
                out[n] = item.workflow.answer(item, decided, now, answers)
            await batch.write()
            await uow.idempotency.store_many(ENDPOINT, answers, now)
            await uow.commit()
        for n in alone:
            out[n] = await items[n].workflow.alone_or_error(items[n])
        return out

    async def _decide(
        self,
        batch: BookingBatch,
        item: _Pending,
        stored: Stored | None,
        now: int,
    ) -> Replayed | Booked | NotPlaced | Deferred | QuotaExceeded:
        req = item.req
        if stored is not None:
            found = matching(stored, req.idempotency_key, item.digest)
            return Replayed(found.status, found.response)
        booking = item.workflow.booking_request(req, now)
        try:
            return await batch.book(booking)
        except QuotaExceeded as exc:
            return exc

    def answer(
        self,
        item: _Pending,
        decided: Replayed | Booked | NotPlaced | QuotaExceeded,
        now: int,
        answers: list[tuple[str, str, str, Recorded]],
    ) -> CreateOutcome | None:
        if isinstance(decided, Replayed):
            return decided
        req = item.req
        record = (req.tenant_id, req.idempotency_key, item.digest)
        if isinstance(decided, Booked):
            words = self.answers.created(decided.reservation, now, decided.warnings)
            answers.append((*record, Recorded(200, words)))
            return Created(decided.reservation, (), now, warnings=decided.warnings)
        error: CoordinatorError
        if isinstance(decided, NotPlaced):
            if item.deadline - asyncio.get_running_loop().time() > 0:
                return None
            error = not_available(decided.placement, decided.preemptible)
        else:
            error = decided
        answers.append((*record, Recorded(error.status, self.answers.refused(error))))
        return Refused(error)

    async def alone_or_error(self, item: _Pending) -> CreateOutcome | Exception | None:
        try:
            return await retrying(lambda: self._attempt(item.req, item.digest, item.deadline))
        except Exception as exc:
            return exc

    def booking_request(self, req: CreateRequest, now: int) -> BookingRequest:
        # Recomputed for every attempt: a request that waited starts when it is placed.
        return BookingRequest(
            tenant_id=req.tenant_id,
            pool_id=req.pool_id,
            project_id=req.project_id,
            placement=req.placement,
            start=resolve_start(req.start, now),
            duration_ms=req.duration_ms,
            lease_seconds=req.lease_seconds,
            resources=req.resources,
            gang=req.gang,
            notice_ms=self.notice_ms,
            busy=self.busy(),
        )

    async def _attempt(
        self, req: CreateRequest, digest: str, deadline: float
    ) -> CreateOutcome | None:
        """One unit of work; None when it did not fit and there is time left to wait."""
        now = self.clock.now_ms()
        key = req.idempotency_key
        async with self.ledger.transaction() as uow:
            await uow.lock_tenant(req.tenant_id)
            await uow.lock_pools(req.pool_id)
            found = await uow.idempotency.lookup(req.tenant_id, ENDPOINT, key, digest)
            if found is not None:
                return Replayed(found.status, found.response)
            booking = self.booking_request(req, now)
            try:
                out = await uow.bookings.book(booking, now)
            except QuotaExceeded as exc:
                error: CoordinatorError = exc
            else:
                if isinstance(out, Booked):
                    words = self.answers.created(out.reservation, now, out.warnings)
                    answer = Recorded(200, words)
                    await uow.idempotency.store(req.tenant_id, ENDPOINT, key, digest, answer, now)
                    notices = notices_for(out.victims, now)
                    await uow.outbox.add(notices)
                    await uow.commit()
                    return Created(out.reservation, out.victims, now, notices, out.warnings)
                if deadline - asyncio.get_running_loop().time() > 0:
                    return None
                error = not_available(out.placement, out.preemptible)
            refusal = Recorded(error.status, self.answers.refused(error))
            await uow.idempotency.store(req.tenant_id, ENDPOINT, key, digest, refusal, now)
            await uow.commit()
            return Refused(error)

    async def renew(
        self, tenant_id: str, reservation_id: str, lease_seconds: int | None
    ) -> Current:
        """Extend a leased, live reservation's lease from now."""
        now = self.clock.now_ms()
        async with self.ledger.transaction() as uow:
            res = await uow.reservations.renew(reservation_id, tenant_id, lease_seconds, now)
            if res is None:
                raise InvalidInput(
                    "the reservation has no lease or is no longer live",
                    {
                        "fields": [
                            {"path": "reservationId", "message": "not renewable", "type": "state"}
                        ]
                    },
                )
            await uow.commit()
        return Current(res, now)

    async def extend(
        self, tenant_id: str | None, reservation_id: str, end: int, *, dry_run: bool = False
    ) -> Moved:
        """Move a live booking's end to `end` on the same devices (`ledger.extensions`
        says when it may); idempotent: the same end again changes nothing. A dry run
        decides the same way and writes nothing."""
        res = await self.ledger.reservations.get(reservation_id, tenant_id)

        async def attempt() -> Moved:
            now = self.clock.now_ms()
            async with self.ledger.transaction() as uow:
                await uow.lock_tenant(res.tenant_id)
                moved = await uow.extensions.extend(reservation_id, tenant_id, end, now)
                if not dry_run and moved.after.end != moved.before.end:
                    await uow.commit()
            return Moved(moved.after, now, moved.before.end)

        moved = await retrying(attempt)
        if not dry_run and moved.reservation.end < moved.previous_end:
            self.capacity.notify()  # time freed: a waiting create may fit now
        return moved

    async def release(self, tenant_id: str, reservation_id: str) -> Current:
        """End a reservation now; the rest of its time is free at once, and a node held
        for a pool move by it moves if it held the node's last booking."""
        now = self.clock.now_ms()
        async with self.ledger.transaction() as uow:
            res = await uow.reservations.release(reservation_id, tenant_id, now)
            await uow.commit()
        moved = await settle_pool_moves(self.ledger, now)
        await alerting.publish(self.alerts, moved, now)
        self.capacity.notify()
        return Current(res, now)
