"""`GET /api/capacity/consumption` and `usage.consumption` (SPEC §13, issue 35) over
HTTP to the in-process app, SQLite and PostgreSQL: interval reservations booked through
the seed's POST, memory use written as the use pass writes it, read back per tenant,
pool and quarter; the calendar's rules for the window; who may read what; nothing
written by a read."""

from __future__ import annotations

import csv
import io
from typing import Any

import aiohttp

from coordinator.domain.consumption import MemoryAccrued, MemoryKey
from coordinator.domain.intervals import INTERVAL_MS as Q
from coordinator.ledger import Ledger
from coordinator.services.gpu_use_watch import GpuUseWatch
from coordinator.services.node_records import record_inventory
from shared.subjects import Subjects
from shared.wire import DeviceUse, ProcessUse, UseReport
from tests.factories import make_inventory
from tests.fakes import RecordingAlerts, RecordingPublisher
from tests.integration.conftest import Api, Served
from tests.integration.coordinator.api.test_intervals import T0, iso

H = 3_600_000
S = T0 + H  # the first booked quarter
GIB_Q = 1024 * Q  # 1 GB held through a quarter, in MiB-ms


async def _get(api: Api, key: str, **query: Any) -> tuple[int, Any]:
    async with api.session.get(
        f"{api.base}/api/capacity/consumption", params=query, headers={"X-API-Key": key}
    ) as resp:
        if resp.content_type == "text/plain":
            return resp.status, await resp.text()
        return resp.status, await resp.json()


async def _reserve(api: Api, key: str, pool: str, quarters: dict[int, int]) -> None:
    body = {
        "intervals": [
            {"startsAt": iso(S + k * Q), "endsAt": iso(S + (k + 1) * Q), "capacityGb": g}
            for k, g in quarters.items()
        ],
        "poolId": pool,
    }
    async with api.session.post(
        f"{api.base}/api/capacity/reservations", json=body, headers={"X-API-Key": key}
    ) as resp:
        assert resp.status == 200, await resp.text()


async def _fleet(served: Served) -> dict[str, str]:
    api, ledger = served.api, served.ledger
    keys = {}
    for tenant in ("acme", "beta"):
        await api.ok("tenants.create", {"tenantId": tenant})
    pool = (await api.ok("pools.create", {"tenantId": "acme", "name": "p"}))["poolId"]
    await api.ok("pools.offer", {"tenantId": "acme", "poolId": pool, "offerTo": "beta"})
    await record_inventory(ledger, make_inventory("n0", pool, memory_gib=512), 1)
    for tenant in ("acme", "beta"):
        keys[tenant] = (await api.ok("apiKeys.create", {"tenantId": tenant}))["key"]
    keys["observer"] = (
        await api.ok("apiKeys.create", {"tenantId": "beta", "roles": ["observer"]})
    )["key"]
    keys["pool"] = pool
    # acme commits 16 GB in quarters 0, 1 and 2; beta commits nothing.
    await _reserve(api, keys["acme"], pool, {0: 16, 1: 16, 2: 16})
    # acme uses exactly 16, then 12 (below), then 20 (above); beta 8 on demand; 4 GB
    # of use no reservation owns.
    used = {
        MemoryKey(S, "acme", pool): MemoryAccrued(16 * GIB_Q, 16 * 1024),
        MemoryKey(S + Q, "acme", pool): MemoryAccrued(12 * GIB_Q, 14 * 1024),
        MemoryKey(S + 2 * Q, "acme", pool): MemoryAccrued(20 * GIB_Q, 24 * 1024),
        MemoryKey(S, "beta", pool): MemoryAccrued(8 * GIB_Q, 8 * 1024),
        MemoryKey(S, "", pool): MemoryAccrued(4 * GIB_Q, 4 * 1024),
    }
    await ledger.gpu_use.record({}, [], [], memory=used)
    return keys


def _short(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [
        (r["startsAt"], r["tenantId"], r["reservedGb"], r["usedGb"], r["coveredGb"],
         r["unusedGb"], r["onDemandGb"])
        for r in rows
    ]  # fmt: skip


async def _memory_rows(ledger: Ledger) -> Any:
    return sorted((await ledger.memory_use.used(0, 2**62)).items())


async def test_each_quarter_splits_reserved_against_used(served: Served) -> None:
    keys = await _fleet(served)
    api = served.api
    window = {"from": iso(S), "to": iso(S + 4 * Q)}
    before = await _memory_rows(served.ledger)
    status, body = await _get(api, api.operator_key, **window)
    assert status == 200, body
    assert _short(body["intervals"]) == [
        (iso(S), None, 0, 4, 0, 0, 4),
        (iso(S), "acme", 16, 16, 16, 0, 0),  # exactly at its commitment
        (iso(S), "beta", 0, 8, 0, 0, 8),  # no commitment: all on demand
        (iso(S + Q), "acme", 16, 12, 12, 4, 0),  # below
        (iso(S + 2 * Q), "acme", 16, 20, 16, 0, 4),  # above
    ]
    first = body["intervals"][1]
    assert (first["endsAt"], first["poolId"], first["peakGb"]) == (iso(S + Q), keys["pool"], 16)
    assert (first["reservedGbHours"], first["usedGbHours"]) == (4, 4)
    assert body["totals"] == {
        "reservedGbHours": 12, "usedGbHours": 15, "coveredGbHours": 11,
        "unusedGbHours": 1, "onDemandGbHours": 4,
    }  # fmt: skip
    assert body["nextCursor"] is None and body["resource"] == "memory_gb"
    # A tenant sees its own rows only, never the unattributed use; an observer all.
    status, mine = await _get(api, keys["beta"], **window)
    assert status == 200 and _short(mine["intervals"]) == [(iso(S), "beta", 0, 8, 0, 0, 8)]
    status, seen = await _get(api, keys["observer"], **window)
    assert status == 200 and seen["intervals"] == body["intervals"]
    status, acme = await _get(api, api.operator_key, tenantId="acme", **window)
    assert [r["tenantId"] for r in acme["intervals"]] == ["acme"] * 3
    # Nothing is written by a read.
    assert await _memory_rows(served.ledger) == before


async def test_pages_follow_the_cursor_and_keep_the_totals(served: Served) -> None:
    await _fleet(served)
    api = served.api
    window = {"from": iso(S), "to": iso(S + 4 * Q)}
    _, whole = await _get(api, api.operator_key, **window)
    rows, cursor, pages = [], None, 0
    while True:
        extra: dict[str, str] = {"cursor": cursor} if cursor else {}
        status, page = await _get(api, api.operator_key, limit="2", **window, **extra)
        assert status == 200, page
        assert page["totals"] == whole["totals"]
        rows += page["intervals"]
        pages += 1
        cursor = page["nextCursor"]
        if cursor is None:
            break
    assert (rows, pages) == (whole["intervals"], 3)


async def test_bad_windows_and_other_tenants_are_refused(served: Served) -> None:
    keys = await _fleet(served)
    api = served.api
    cases = [
        ({"from": iso(S + 1000), "to": iso(S + Q)}, "15-minute"),  # off the grid
        ({"from": iso(S + Q), "to": iso(S)}, "to: must be after from"),  # reversed
        ({"from": iso(S), "to": iso(S + 35 * 24 * H + Q)}, "35 days"),  # too long
        ({"from": iso(S)}, "from and to are required"),
        ({"from": iso(S), "to": iso(S + Q), "limit": "0"}, "limit"),
        ({"from": iso(S), "to": iso(S + Q), "cursor": "bm9wZQ"}, "cursor"),
        ({"from": "yesterday", "to": iso(S + Q)}, "from"),
    ]
    for query, words in cases:
        status, text = await _get(api, keys["acme"], **query)
        assert status == 400 and isinstance(text, str) and words in text, (query, text)
    window = {"from": iso(S), "to": iso(S + Q)}
    status, body = await _get(api, keys["beta"], tenantId="acme", **window)
    assert status == 403 and body["error"]["code"] == "PERMISSION_DENIED", body
    status, _ = await _get(api, keys["beta"], poolId=keys["pool"][:-2] + "zz", **window)
    assert status == 404


async def test_device_bookings_split_booked_hours_into_used_and_unused(served: Served) -> None:
    keys = await _fleet(served)
    api = served.api
    status, body = await api.call("usage.consumption", {"from": S, "to": S + H})
    assert status == 200, body
    assert body == {"from": S, "to": S + H, "reservations": [], "onDemand": []}
    status, body = await api.call(
        "usage.consumption", {"tenantId": "acme", "from": S, "to": S + H}, key=keys["beta"]
    )
    assert status == 403, body
    status, body = await api.call("usage.consumption", {"from": S + H, "to": S}, key=keys["acme"])
    assert status == 400 and body["error"]["code"] == "INVALID_INPUT", body


async def test_each_tenant_s_unbooked_time_on_one_gpu_in_one_hour_is_its_own(
    served: Served,
) -> None:
    """A GPU nobody booked runs acme's process, then beta's, then acme's again, all in
    one hour, through the use pass on a fake clock (written every minute): each tenant is
    charged its own minute on demand. (Before: the hour's one bucket per GPU kept the
    first tenant, so acme was charged all two minutes and beta nothing.)"""
    keys = await _fleet(served)
    pool, clock = keys["pool"], served.clock
    owners, booked = {}, set()
    for tenant in ("acme", "beta"):
        answer = await served.api.ok(
            "reservations.create",
            {"tenantId": tenant, "poolId": pool, "devices": [{"class": "gpu", "count": 1}],
             "start": S, "duration": "2h", "idempotencyKey": tenant},
            keys[tenant],
        )  # fmt: skip
        owners[tenant] = answer["reservationId"]
        booked |= {a["atomId"] for a in answer["atoms"]}
    inv = make_inventory("n0", pool, memory_gib=512)
    free = next(a.device_id for a in inv.atoms if a.cls == "gpu" and a.atom_id not in booked)
    watch = GpuUseWatch(
        served.ledger, Subjects("t"), clock, RecordingPublisher(), RecordingAlerts(),
        reachable=lambda _: True, max_gap_ms=60_000, flush_ms=60_000,
    )  # fmt: skip
    watch.on_inventory(inv)
    clock.advance(S - clock.now_ms())
    # Each pass credits the 10 s before it to what runs at it: acme 30 s, beta 60 s
    # (over a write), acme 30 s.
    for i in range(13):
        tenant = "beta" if 4 <= i <= 9 else "acme"
        proc = ProcessUse(pid=1, owner=owners[tenant], owner_kind="reservation")
        busy = DeviceUse(device_id=free, sm_util=50, processes=(proc,))
        watch.on_report(
            UseReport(node_id="n0", pool_id=pool, boot_id="b", sent_at=0, use_version=1,
                      devices=(busy,))
        )  # fmt: skip
        await watch.tick()
        clock.advance(10_000)
    clock.advance(2 * H)
    status, body = await served.api.call("usage.consumption", {"from": S, "to": S + H})
    assert status == 200, body
    assert body["onDemand"] == [
        {"tenantId": "acme", "poolId": pool, "usedHours": 0.016667},
        {"tenantId": "beta", "poolId": pool, "usedHours": 0.016667},
    ]
    status, mine = await served.api.call(
        "usage.consumption", {"tenantId": "beta", "from": S, "to": S + H}, key=keys["beta"]
    )
    assert status == 200 and mine["onDemand"] == body["onDemand"][1:], mine
    # The FOCUS export charges the same: each tenant its own minute at the on-demand price.
    async with served.api.session.post(
        f"{served.api.base}/api/compute/usage/export",
        json={"from": S, "to": S + H},
        headers={"Authorization": f"Bearer {served.api.operator_key}"},
    ) as resp:
        assert resp.status == 200, await resp.text()
        rows = list(csv.DictReader(io.StringIO(await resp.text())))
    assert sorted(
        (r["SubAccountId"], r["ConsumedQuantity"])
        for r in rows
        if r["ConsumedUnit"] == "GPU-Hours" and not r["CapacityReservationId"]
    ) == [("acme", "0.0166666667"), ("beta", "0.0166666667")]


async def test_an_unknown_client_gets_401(served: Served) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(
            f"{served.api.base}/api/capacity/consumption",
            params={"from": iso(S), "to": iso(S + Q)},
        ) as resp:
            assert resp.status == 401
