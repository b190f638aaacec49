"""Group commit of reservations.create (SPEC §8 throughput, every rule of §2-§5 kept):
concurrent creates of one pool share one unit of work, and each still gets exactly the
outcome it would have got alone — a refusal, a quota, a bad start or a key conflict of
one never fails its neighbours, the batch never books one device twice, and an error
while answering one request loses no other request's booking."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest
from sqlalchemy import select

from coordinator.api.http.render import RESERVATION_ANSWERS
from coordinator.domain.errors import (
    CapacityNotAvailable,
    CoordinatorError,
    IdempotencyKeyConflict,
    InvalidInput,
    QuotaExceeded,
)
from coordinator.domain.model import Quota
from coordinator.domain.reservation import Reservation
from coordinator.ledger import Ledger, schema
from coordinator.services.idempotent import Replayed
from coordinator.services.reservations import (
    Created,
    CreateOutcome,
    CreateRequest,
    Refused,
)
from tests.database import database
from tests.rig import HOUR, TENANT, Rig


@pytest.fixture
async def rig(ledger: Ledger) -> Rig:
    return await Rig.open(ledger)


async def together(rig: Rig, *requests: CreateRequest) -> list[CreateOutcome | BaseException]:
    """Submit `requests` at once: they are queued before the first batch starts, so they
    form one batch (checked by the caller through `batches_run`)."""
    return await asyncio.gather(
        *(rig.reservations.create(r) for r in requests), return_exceptions=True
    )


async def bookings_version(url: str, pool_id: str) -> int:
    async with database(url) as db, db.read() as conn:
        v = schema.pool_versions.c
        row = await conn.execute(select(v.bookings_version).where(v.pool_id == pool_id))
        return int(row.scalar_one())


async def test_refusals_and_errors_in_a_batch_leave_their_neighbours_booked(
    rig: Rig, database_url: str
) -> None:
    pool = await rig.pool(nodes=1, gpus=8)
    await rig.ledger.quotas.set(Quota(TENANT, pool, "gpu", 7), rig.clock.now_ms())
    start = rig.clock.now_ms() + HOUR
    first = await rig.reservations.create(rig.request(pool, "k-taken", gpus=1, start=start))
    assert isinstance(first, Created)
    version = await bookings_version(database_url, pool)
    batches = rig.reservations.batches_run
    outcomes = await together(
        rig,
        rig.request(pool, "a", gpus=2, start=start),
        rig.request(pool, "too-big", gpus=9, start=start),
        rig.request(pool, "b", gpus=2, start=start),
        rig.request(pool, "past", gpus=1, start=start - 2 * HOUR),
        rig.request(pool, "k-taken", gpus=3, start=start),  # same key, another body
        rig.request(pool, "c", gpus=2, start=start),
        rig.request(pool, "over-quota", gpus=1, start=start),  # 1 + 2 + 2 + 2 + 1 > 7
    )
    assert rig.reservations.batches_run == batches + 1
    a, too_big, b, past, conflict, c, over_quota = outcomes
    for ok in (a, b, c):
        assert isinstance(ok, Created), ok
    assert isinstance(too_big, Refused) and isinstance(too_big.error, CapacityNotAvailable)
    assert isinstance(past, InvalidInput)
    assert isinstance(conflict, IdempotencyKeyConflict)
    assert isinstance(over_quota, Refused) and isinstance(over_quota.error, QuotaExceeded)
    assert over_quota.error.details["used"] == 7
    # One unit of work: the bookings counter moved once for the three bookings.
    assert await bookings_version(database_url, pool) == version + 1
    taken = [a.atom_id for out in (first, a, b, c) for a in out.reservation.atoms]  # type: ignore[union-attr]
    assert len(taken) == len(set(taken)) == 7
    # Refusals were recorded with the batch: a retry replays them.
    again = await rig.reservations.create(rig.request(pool, "too-big", gpus=9, start=start))
    assert isinstance(again, Replayed) and again.status == 409
    row = await rig.row(pool, "gpu")
    assert (row.reserved, row.available) == (7, 1)


async def test_concurrent_creates_in_batches_never_double_book(rig: Rig, database_url: str) -> None:
    pool = await rig.pool(nodes=2, gpus=8)
    start = rig.clock.now_ms() + HOUR
    requests = [
        rig.request(pool, f"r{i}", gpus=1 + i % 3, start=start + (i % 2) * HOUR // 2)
        for i in range(24)
    ]
    outcomes = await together(rig, *requests)
    booked = [out for out in outcomes if isinstance(out, Created)]
    refused = [out for out in outcomes if isinstance(out, Refused)]
    assert len(booked) + len(refused) == len(requests)
    assert booked and refused
    async with database(database_url) as db, db.read() as conn:
        rows = (await conn.execute(select(schema.bookings))).all()
    spans: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for row in rows:
        spans[row.atom_id].append((row.start, row.end))
    for atom, held in spans.items():
        for (_, end), (begin, _) in itertools.pairwise(sorted(held)):
            assert begin >= end, f"{atom} double booked: {held}"
    assert len(rows) == sum(len(out.reservation.atoms) for out in booked)
    # The cache took the batch's bookings: a later create takes only what is free.
    left = await rig.reservations.create(rig.request(pool, "left", gpus=1, start=start))
    if isinstance(left, Created):
        for atom in left.reservation.atoms:
            assert all(e <= start or s >= start + HOUR for s, e in spans.get(atom.atom_id, []))


async def test_one_key_twice_in_a_batch_is_booked_once(rig: Rig) -> None:
    pool = await rig.pool(nodes=1, gpus=8)
    same = rig.request(pool, "twice", gpus=2)
    first, second = await together(rig, same, same)
    assert isinstance(first, Created)
    assert isinstance(second, Replayed) and second.status == 200
    assert second.body["reservationId"] == first.reservation.reservation_id
    row = await rig.row(pool, "gpu")
    assert row.allocated == 2


async def test_a_tenant_quota_counts_the_bookings_decided_earlier_in_the_batch(rig: Rig) -> None:
    a, b = await rig.pool(nodes=1, gpus=8), await rig.pool(nodes=1, gpus=8)
    await rig.ledger.quotas.set(Quota(TENANT, None, "gpu", 5), rig.clock.now_ms())
    held = await rig.reservations.create(rig.request(b, "elsewhere", gpus=1))
    assert isinstance(held, Created)
    outcomes = await together(rig, *(rig.request(a, f"q{i}", gpus=2) for i in range(3)))
    assert [type(out) for out in outcomes] == [Created, Created, Refused]
    refused = outcomes[2]
    assert isinstance(refused, Refused) and isinstance(refused.error, QuotaExceeded)
    assert (refused.error.details["used"], refused.error.details["limit"]) == (5, 5)


async def test_a_preempting_request_in_a_batch_runs_alone_and_notices(rig: Rig) -> None:
    pool = await rig.pool(nodes=1, gpus=8)
    spot = await rig.reservations.create(rig.request(pool, "spot", gpus=6, spot=True))
    assert isinstance(spot, Created)
    regular, small = await together(
        rig, rig.request(pool, "regular", gpus=4), rig.request(pool, "small", gpus=1)
    )
    assert isinstance(small, Created)
    assert isinstance(regular, Created)
    assert [v.reservation_id for v in regular.victims] == [spot.reservation.reservation_id]
    (alert,) = rig.alerts.alerts
    assert alert.kind == "reservation.notice"


class _FailingAnswers:
    """Words answers as the API does, but fails for a reservation with a 1313 s lease: an
    error while answering one request of a batch."""

    def created(self, reservation: Reservation, now: int, warnings: Sequence[str] = ()) -> Any:
        if reservation.lease_seconds == 1313:
            raise RuntimeError("answering this one failed")
        return RESERVATION_ANSWERS.created(reservation, now, warnings)

    def refused(self, error: CoordinatorError) -> Any:
        return RESERVATION_ANSWERS.refused(error)


async def test_an_error_in_one_request_loses_no_other_booking(rig: Rig) -> None:
    pool = await rig.pool(nodes=1, gpus=8)
    # Other wording, the same group commit: it batches with rig.reservations.
    failing = dataclasses.replace(rig.reservations, answers=_FailingAnswers())
    batches = rig.reservations.batches_run
    outcomes = await asyncio.gather(
        failing.create(rig.request(pool, "ok-1", gpus=2)),
        failing.create(rig.request(pool, "boom", gpus=2, leaseSeconds=1313)),
        failing.create(rig.request(pool, "ok-2", gpus=2)),
        # Answered by its own workflow, though the batch runs on the failing one's.
        rig.reservations.create(rig.request(pool, "own-words", gpus=1, leaseSeconds=1313)),
        return_exceptions=True,
    )
    assert rig.reservations.batches_run == batches + 1
    ok1, boom, ok2, own = outcomes
    assert isinstance(boom, RuntimeError)
    assert isinstance(ok1, Created) and isinstance(ok2, Created) and isinstance(own, Created)
    # Both acknowledged bookings are durable and replay; the failed one left nothing.
    for key, out in (("ok-1", ok1), ("ok-2", ok2)):
        replay = await rig.reservations.create(rig.request(pool, key, gpus=2))
        assert isinstance(replay, Replayed)
        assert replay.body["reservationId"] == out.reservation.reservation_id
    row = await rig.row(pool, "gpu")
    assert row.allocated == 5
    retried = await rig.reservations.create(rig.request(pool, "boom", gpus=2, leaseSeconds=1313))
    assert isinstance(retried, Created)
    # The cache and the ledger agree after the failed batch: 1 GPU is left.
    last = await together(rig, rig.request(pool, "x", gpus=1), rig.request(pool, "y", gpus=1))
    assert isinstance(last[0], Created) and isinstance(last[1], Refused)


async def test_requests_arriving_while_a_batch_runs_join_the_next_one(rig: Rig) -> None:
    pool = await rig.pool(nodes=1, gpus=8)
    before = rig.reservations.batches_run
    first = asyncio.create_task(rig.reservations.create(rig.request(pool, "first")))
    for _ in range(100):  # a few turns of the loop: the first batch starts
        if rig.reservations.batches_run > before:
            break
        await asyncio.sleep(0)
    assert rig.reservations.batches_run == before + 1
    later = [rig.request(pool, f"later-{i}") for i in range(3)]
    outcomes = await together(rig, *later)
    assert isinstance(await first, Created)
    assert all(isinstance(out, Created) for out in outcomes)
    # The three that came while the first ran (or just after) made one batch.
    assert rig.reservations.batches_run == before + 2


async def test_whole_nodes_gangs_and_spot_in_one_batch_claim_each_device_once(
    rig: Rig, database_url: str
) -> None:
    pool = await rig.pool(nodes=4, gpus=8)
    version = await bookings_version(database_url, pool)
    outcomes = await together(
        rig,
        rig.request(pool, "whole", binding="node"),
        rig.request(pool, "gang", gpus=4, gang={"size": 2}),
        *(rig.request(pool, f"small-{i}", gpus=2) for i in range(4)),
        rig.request(pool, "spot", gpus=2, spot=True),
    )
    assert all(isinstance(out, Created) for out in outcomes), outcomes
    # One unit of work, not one per request (a batch that failed and fell back to
    # running each alone would have moved the counter once per booking).
    assert await bookings_version(database_url, pool) == version + 1
    whole = outcomes[0]
    assert isinstance(whole, Created)
    whole_node = whole.reservation.atoms[0].node_id
    others = [a for out in outcomes[1:] for a in out.reservation.atoms]  # type: ignore[union-attr]
    assert whole_node not in {a.node_id for a in others}
    assert len({a.atom_id for a in others}) == len(others) == 8 + 8 + 2
    async with database(database_url) as db, db.read() as conn:
        claims = (await conn.execute(select(schema.device_claims))).all()
    exclusive: dict[tuple[str, str, str | None], int] = defaultdict(int)
    for row in claims:
        if row.exclusive:
            exclusive[(row.node_id, row.device, row.part)] += 1
    assert exclusive and all(n == 1 for n in exclusive.values()), exclusive


async def test_tenants_in_one_batch_each_meet_their_own_quota(rig: Rig) -> None:
    pool = await rig.pool(nodes=1, gpus=8)
    await rig.ledger.tenants.create("beta", "Beta", rig.clock.now_ms())
    await rig.ledger.quotas.set(Quota(TENANT, None, "gpu", 2), rig.clock.now_ms())

    def beta(key: str) -> CreateRequest:
        req = rig.request(pool, key, gpus=2)
        return replace(req, tenant_id="beta")

    outcomes = await together(
        rig, rig.request(pool, "a1", gpus=2), beta("b1"), rig.request(pool, "a2", gpus=2),
        beta("b2"),
    )  # fmt: skip
    assert [type(out) for out in outcomes] == [Created, Created, Refused, Created]
    assert [out.reservation.tenant_id for out in outcomes if isinstance(out, Created)] == [
        TENANT, "beta", "beta",
    ]  # fmt: skip
