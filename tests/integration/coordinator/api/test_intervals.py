"""Interval reservations and the calendar (seed 002) over HTTP to the in-process app,
SQLite and PostgreSQL. The validation table is tests/unit/coordinator/api/test_inputs.py."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import aiohttp
import pytest

from coordinator.ledger import Ledger
from coordinator.services.node_records import record_inventory
from tests.factories import make_inventory
from tests.integration.conftest import Api, Served

T0 = 1_800_000_000_000  # on the 15-minute grid
Q = 900_000


def iso(ms: int, offset: str = "Z") -> str:
    text = datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return text + offset


def iv(k: int, gb: int = 16) -> dict[str, Any]:
    """The k-th quarter after T0 + 1 h."""
    start = T0 + 3_600_000 + k * Q
    return {"startsAt": iso(start), "endsAt": iso(start + Q), "capacityGb": gb}


class Rest:
    def __init__(self, session: aiohttp.ClientSession, base: str, key: str) -> None:
        self.session, self.base, self.key = session, base, key

    async def post(
        self,
        body: Any,
        idem: str | None = None,
        raw: bytes | None = None,
        key: str | None = None,
        pool: str | None = None,
    ) -> tuple[int, Any]:
        headers = {"X-API-Key": key or self.key}
        if idem is not None:
            headers["Idempotency-Key"] = idem
        kwargs: dict[str, Any] = {"data": raw} if raw is not None else {"json": body}
        if pool is not None:
            kwargs["params"] = {"poolId": pool}
        async with self.session.post(
            f"{self.base}/api/capacity/reservations", headers=headers, **kwargs
        ) as resp:
            if resp.content_type == "text/plain":
                return resp.status, await resp.text()
            return resp.status, await resp.json()

    async def get(self, path: str, **query: Any) -> tuple[int, Any]:
        async with self.session.get(
            f"{self.base}{path}", params=query, headers={"X-API-Key": self.key}
        ) as resp:
            if resp.content_type == "text/plain":
                return resp.status, await resp.text()
            return resp.status, await resp.json()


async def _setup(api: Api, ledger: Ledger, nodes: int = 2) -> tuple[str, str]:
    await api.ok("tenants.create", {"tenantId": "acme"})
    pool = (await api.ok("pools.create", {"tenantId": "acme", "name": "p"}))["poolId"]
    for i in range(nodes):
        await record_inventory(ledger, make_inventory(f"n{i}", pool, memory_gib=512), 1)
    key = (await api.ok("apiKeys.create", {"tenantId": "acme"}))["key"]
    return pool, key


@pytest.fixture
async def capi(served: Served) -> Api:
    return served.api


@pytest.fixture
async def rest(served: Served) -> tuple[Rest, str]:
    pool, key = await _setup(served.api, served.ledger)
    return Rest(served.api.session, served.api.base, key), pool


async def test_a_reservation_commits_every_interval_and_shows_in_calendar_and_rollup(
    rest: tuple[Rest, str], capi: Api
) -> None:
    client, pool = rest
    status, body = await client.post({"intervals": [iv(0), iv(1, 32)]})
    assert status == 200, body
    assert set(body) == {"reservationId", "createdAt", "intervals"}
    assert body["createdAt"] == iso(T0)
    assert body["intervals"] == [iv(0), iv(1, 32)]
    rows = (await capi.ok("capacity.byPool", {"tenantId": "acme", "poolId": pool}))["rows"]
    memory = next(r for r in rows if r["resource"] == "memoryGiB")
    # 16 then 32 GB in consecutive quarters: `reserved` is the peak, 32, not the sum.
    assert (memory["allocatable"], memory["reserved"]) == (1024, 32)
    status, cal = await client.get(
        "/api/capacity/calendar", **{"from": iso(T0 + 3_600_000), "to": iso(T0 + 3_600_000 + 3 * Q)}
    )
    assert status == 200
    assert cal["intervals"] == [
        {"startsAt": iso(T0 + 3_600_000), "endsAt": iso(T0 + 3_600_000 + Q),
         "reservationLimitGb": 1024, "reservedGb": 16, "reservableGb": 1008},
        {"startsAt": iso(T0 + 3_600_000 + Q), "endsAt": iso(T0 + 3_600_000 + 2 * Q),
         "reservationLimitGb": 1024, "reservedGb": 32, "reservableGb": 992},
        {"startsAt": iso(T0 + 3_600_000 + 2 * Q), "endsAt": iso(T0 + 3_600_000 + 3 * Q),
         "reservationLimitGb": 1024, "reservedGb": 0, "reservableGb": 1024},
    ]  # fmt: skip


async def test_the_seeds_400s_reach_the_wire_as_plain_text(rest: tuple[Rest, str]) -> None:
    client, _ = rest
    status, text = await client.post({"intervals": [iv(0) | {"capacityGb": 6}]})
    assert (status, isinstance(text, str) and "multiple of 4" in text) == (400, True), text
    status, text = await client.post([iv(0)])
    assert (status, isinstance(text, str) and "JSON object" in text) == (400, True), text
    status, text = await client.post(None, raw=b"{nope")
    assert (status, "JSON" in text) == (400, True)
    status, text = await client.post({"intervals": [iv(0)]}, idem="bad key")
    assert (status, isinstance(text, str) and "Idempotency-Key" in text) == (400, True), text
    # Any offset is accepted and compared in UTC.
    start = T0 + 3_600_000
    shifted = {
        "startsAt": iso(start + 7_200_000, "+02:00"),
        "endsAt": iso(start + 7_200_000 + Q, "+02:00"),
        "capacityGb": 4,
    }
    status, body = await client.post({"intervals": [shifted]})
    assert status == 200 and body["intervals"][0]["startsAt"] == iso(start)


async def test_a_shortfall_is_409_listing_every_failing_interval_and_writes_nothing(
    rest: tuple[Rest, str], capi: Api
) -> None:
    client, _pool = rest
    await capi.ok("quotas.set", {"tenantId": "acme", "resource": "memoryGiB", "limit": 100})
    status, body = await client.post({"intervals": [iv(0, 96), iv(1, 104), iv(2, 200)]})
    assert status == 409
    assert body == {
        "error": "capacity_not_available",
        "intervals": [
            {"startsAt": iv(1)["startsAt"], "requestedGb": 104, "reservableGb": 100,
             "reason": "insufficient_capacity"},
            {"startsAt": iv(2)["startsAt"], "requestedGb": 200, "reservableGb": 100,
             "reason": "insufficient_capacity"},
        ],
    }  # fmt: skip
    status, listed = await client.get(
        "/api/capacity/reservations", **{"from": iso(T0 - Q), "to": iso(T0 + Q)}
    )
    assert listed["reservations"] == []
    assert (await client.post({"intervals": [iv(0, 96)]}))[0] == 200
    status, body = await client.post({"intervals": [iv(0, 8)]})
    assert status == 409 and body["intervals"][0]["reservableGb"] == 4


async def test_idempotency_key_replays_and_conflicts(rest: tuple[Rest, str]) -> None:
    client, _ = rest
    first = await client.post({"intervals": [iv(0)]}, idem="nightly-2027-01-15")
    again = await client.post({"intervals": [iv(0)]}, idem="nightly-2027-01-15")
    assert first[0] == 200 and again == first
    status, body = await client.post({"intervals": [iv(0, 8)]}, idem="nightly-2027-01-15")
    assert (status, body["error"]) == (409, "idempotency_key_conflict")
    a = await client.post({"intervals": [iv(3)]})
    b = await client.post({"intervals": [iv(3)]})
    assert a[1]["reservationId"] != b[1]["reservationId"]


async def test_there_is_no_way_to_cancel_or_modify(rest: tuple[Rest, str]) -> None:
    client, _ = rest
    _, made = await client.post({"intervals": [iv(0)]})
    for verb, path in (
        ("DELETE", f"/api/capacity/reservations/{made['reservationId']}"),
        ("DELETE", "/api/capacity/reservations"),
        ("PUT", "/api/capacity/reservations"),
        ("PATCH", "/api/capacity/reservations"),
    ):
        async with client.session.request(
            verb, f"{client.base}{path}", headers={"X-API-Key": client.key}
        ) as resp:
            assert resp.status in (404, 405), (verb, path)
    _, listed = await client.get(
        "/api/capacity/reservations", **{"from": iso(T0), "to": iso(T0 + Q)}
    )
    assert [r["reservationId"] for r in listed["reservations"]] == [made["reservationId"]]


async def test_the_audit_list_pages_newest_first_through_shared_created_at(
    rest: tuple[Rest, str], served: Served
) -> None:
    clock = served.clock
    client, _ = rest
    made = []
    for k in range(7):
        if k in (3, 5):
            clock.advance(1000)
        made.append((await client.post({"intervals": [iv(k, 4)]}))[1])
    expected = sorted(made, key=lambda r: (r["createdAt"], r["reservationId"]), reverse=True)
    seen: list[str] = []
    cursor = None
    window = {"from": iso(T0), "to": iso(T0 + 3_600_000)}
    while True:
        query = window | {"limit": 2} | ({"cursor": cursor} if cursor else {})
        status, page = await client.get("/api/capacity/reservations", **query)
        assert status == 200 and len(page["reservations"]) <= 2
        seen += [r["reservationId"] for r in page["reservations"]]
        cursor = page["nextCursor"]
        if cursor is None:
            break
    assert seen == [r["reservationId"] for r in expected]
    status, page = await client.get("/api/capacity/reservations", **window, limit=5000)
    assert status == 200 and len(page["reservations"]) == 7  # clamped, not refused
    # The window and limit rules are tests/unit/coordinator/api/test_inputs.py's; the cursor is the
    # handler's own.
    for bad in ({"from": iso(T0)}, window | {"cursor": "!!!"}, window | {"limit": 0}):
        status, text = await client.get("/api/capacity/reservations", **bad)
        assert status == 400 and isinstance(text, str), bad
    # createdAt in [from, to): the newest ones were made at T0 + 2 s.
    status, page = await client.get(
        "/api/capacity/reservations", **{"from": iso(T0), "to": iso(T0 + 2000)}
    )
    assert len(page["reservations"]) == 5


async def test_calendar_windows_and_past_rows(rest: tuple[Rest, str]) -> None:
    client, _ = rest
    status, cal = await client.get(
        "/api/capacity/calendar", **{"from": iso(T0 - 2 * Q), "to": iso(T0 + 2 * Q)}
    )
    assert status == 200 and len(cal["intervals"]) == 4
    status, text = await client.get(
        "/api/capacity/calendar", **{"from": iso(T0 + 60_000), "to": iso(T0 + Q)}
    )
    assert (status, "15-minute" in text) == (400, True), text


async def test_an_operator_reads_a_tenants_calendar_and_a_tenant_only_its_own(
    rest: tuple[Rest, str], capi: Api
) -> None:
    """The console's operator acts for a tenant: the calendar takes `tenantId` (an
    operator's key, or the tenant's own); without it the key's own tenant is meant."""
    client, pool = rest
    assert (await client.post({"intervals": [iv(0, 16)]}, idem="op-cal"))[0] == 200
    window = {"from": iv(0)["startsAt"], "to": iv(2)["startsAt"], "poolId": pool}
    operator = Rest(client.session, client.base, capi.operator_key)
    status, cal = await operator.get("/api/capacity/calendar", **window, tenantId="acme")
    assert status == 200, cal
    assert [i["reservedGb"] for i in cal["intervals"]] == [16, 0]
    # The operator's own tenant does not see acme's pool: 404, as before.
    assert (await operator.get("/api/capacity/calendar", **window))[0] == 404
    status, own = await client.get("/api/capacity/calendar", **window, tenantId="acme")
    assert (status, own["intervals"]) == (200, cal["intervals"])
    status, err = await client.get("/api/capacity/calendar", **window, tenantId="globex")
    assert status == 403 and err["error"]["code"] == "PERMISSION_DENIED", err
    status, text = await operator.get("/api/capacity/calendar", **window, tenantId="a b")
    assert (status, "tenantId" in text) == (400, True), text


async def test_committed_memory_binds_compute_reservations_in_that_window(
    rest: tuple[Rest, str], capi: Api
) -> None:
    client, pool = rest
    intervals = [iv(k, 1000) for k in range(4)]
    assert (await client.post({"intervals": intervals}))[0] == 200
    body = {
        "tenantId": "acme", "poolId": pool, "devices": [{"class": "gpu", "count": 1}],
        "resources": {"memoryGiB": 64}, "start": T0 + 3_600_000, "duration": "30m",
        "idempotencyKey": "c1",
    }  # fmt: skip
    status, err = await capi.call("reservations.create", body)
    assert status == 409 and "memoryGiB" in err["error"]["message"]
    later = body | {"start": T0 + 3_600_000 + 4 * Q, "idempotencyKey": "c2"}
    assert (await capi.call("reservations.create", later))[0] == 200
    small = body | {"resources": {"memoryGiB": 24}, "idempotencyKey": "c3"}
    assert (await capi.call("reservations.create", small))[0] == 200
    # ... and the other way round: that compute booking's memory is not reservable.
    status, out = await client.post({"intervals": [iv(0, 4)]})
    assert status == 409 and out["intervals"][0]["reservableGb"] == 0


async def test_16_parallel_writers_never_over_commit(rest: tuple[Rest, str]) -> None:
    client, _ = rest
    answers = await asyncio.gather(
        *(client.post({"intervals": [iv(0, 96), iv(1, 96)]}) for _ in range(16))
    )
    won = [b for s, b in answers if s == 200]
    lost = [b for s, b in answers if s == 409]
    assert len(won) == 10 and len(lost) == 6  # 1024 GB // 96 GB
    reasons = {i["reason"] for b in lost for i in b["intervals"]}
    assert reasons <= {"concurrent_write", "insufficient_capacity"}
    assert "concurrent_write" in reasons
    assert all(i["reservableGb"] == 64 for b in lost for i in b["intervals"])
    _status, cal = await client.get(
        "/api/capacity/calendar", **{"from": iv(0)["startsAt"], "to": iv(2)["startsAt"]}
    )
    assert [row["reservedGb"] for row in cal["intervals"]] == [960, 960]


@pytest.mark.parametrize("fraction", ["0000001", "000000999", "0001"])
async def test_a_time_off_the_millisecond_grid_is_the_seeds_400_and_books_nothing(
    rest: tuple[Rest, str], fraction: str
) -> None:
    """SPEC §5: whatever its number of digits, such a time is misaligned, not truncated
    onto the quarter (seven digits and more used to be booked at 01:00)."""
    client, _ = rest
    start = T0 + 3_600_000
    off = iso(start, f".{fraction}Z")
    status, text = await client.post({"intervals": [iv(0) | {"startsAt": off}]}, idem="off")
    assert (status, text) == (
        400,
        "intervals[0].startsAt: not aligned to a 15-minute UTC boundary\n",
    )
    status, cal = await client.get(
        "/api/capacity/calendar", **{"from": iso(start), "to": iso(start + Q)}
    )
    assert status == 200 and cal["intervals"][0]["reservedGb"] == 0
    status, page = await client.get(
        "/api/capacity/reservations", **{"from": iso(T0), "to": iso(T0 + 3_600_000)}
    )
    assert status == 200 and page["reservations"] == []
    # The key recorded nothing either: the same key with a good body books.
    status, body = await client.post({"intervals": [iv(0)]}, idem="off")
    assert status == 200, body
    # Query parameters: the calendar's grid, the audit list's whole milliseconds.
    status, text = await client.get("/api/capacity/calendar", **{"from": off, "to": iso(start + Q)})
    assert (status, text) == (400, "from/to: must be on the 15-minute UTC grid\n")
    status, text = await client.get("/api/capacity/reservations", **{"from": iso(T0), "to": off})
    assert (status, text) == (400, f"to: {off!r} has a fraction below the millisecond\n")
