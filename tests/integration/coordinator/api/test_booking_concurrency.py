"""No double booking: 32 concurrent clients on SQLite and PostgreSQL, and the database's
own constraint on PostgreSQL."""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections import defaultdict

import pytest
from sqlalchemy import select, text
from sqlalchemy.exc import IntegrityError

from coordinator.app import Coordinator
from coordinator.ledger import Ledger, schema
from coordinator.services.node_records import record_inventory
from shared.ids import new_pool_id
from tests.database import database
from tests.factories import make_inventory
from tests.integration.conftest import Api

CLIENTS = 32
REQUESTS_EACH = 4


async def test_32_concurrent_clients_never_double_book(api: Api, coordinator: Coordinator) -> None:
    await api.ok("tenants.create", {"tenantId": "acme"})
    pool = (await api.ok("pools.create", {"tenantId": "acme", "name": "p"}))["poolId"]
    for i in range(4):
        await record_inventory(coordinator.ledger, make_inventory(f"n{i}", pool, gpus=8), 1)
    key = (await api.ok("apiKeys.create", {"tenantId": "acme"}))["key"]
    base = int(time.time() * 1000) + 3_600_000
    rng = random.Random(7)
    plans = [
        [
            {
                "tenantId": "acme",
                "poolId": pool,
                "devices": [{"class": "gpu", "count": rng.randint(1, 6)}],
                "start": base + rng.randint(0, 5) * 600_000,
                "duration": rng.choice(["10m", "20m", "30m"]),
                "idempotencyKey": f"c{c}-r{r}",
            }
            for r in range(REQUESTS_EACH)
        ]
        for c in range(CLIENTS)
    ]

    async def client(requests: list[dict[str, object]]) -> list[tuple[int, dict[str, object]]]:
        out = []
        for body in requests:
            out.append(await api.call("reservations.create", body, key))
        return out

    results = [r for rs in await asyncio.gather(*(client(p) for p in plans)) for r in rs]
    ok = [body for status, body in results if status == 200]
    refused = [body for status, body in results if status != 200]
    assert ok and refused, "the load should both fit and overflow"
    assert all(b["error"]["code"] == "CAPACITY_NOT_AVAILABLE" for b in refused)

    async with (
        database(coordinator.settings.effective_database_url) as db,
        db.read() as conn,
    ):
        bookings = (await conn.execute(select(schema.bookings))).all()
        stored = {
            r.reservation_id: r for r in (await conn.execute(select(schema.reservations))).all()
        }
    by_atom: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for b in bookings:
        by_atom[b.atom_id].append((b.start, b.end))
    for atom, spans in by_atom.items():
        spans.sort()
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert start >= end, f"{atom} double booked: {spans}"
    # Every 2xx answer is in the ledger, with exactly the atoms it was promised.
    for body in ok:
        row = stored[str(body["reservationId"])]
        assert sorted(a["atomId"] for a in row.atoms) == sorted(
            a["atomId"]
            for a in body["atoms"]  # type: ignore[attr-defined]
        )
    assert len(stored) == len(ok)


async def test_postgres_itself_refuses_overlapping_bookings(
    ledger: Ledger, database_url: str
) -> None:
    if ledger.dialect != "postgresql":
        pytest.skip("the exclusion constraint is PostgreSQL's")
    row = {
        "reservation_id": "rsv_a", "tenant_id": "t", "pool_id": new_pool_id(), "node_id": "n",
        "atom_id": "n:gpu:0", "class": "gpu", "spot": False, "start": 100, "end": 200,
    }  # fmt: skip
    async with database(database_url) as db:
        async with db.transaction() as conn:
            await conn.execute(schema.bookings.insert(), [row, row | {"start": 200, "end": 300}])
        with pytest.raises(IntegrityError, match="bookings_no_overlap"):
            async with db.transaction() as conn:
                await conn.execute(
                    schema.bookings.insert(), [row | {"reservation_id": "rsv_b", "start": 150}]
                )
        async with db.read() as conn:
            count = (await conn.execute(text("SELECT count(*) FROM bookings"))).scalar_one()
    assert count == 2
