"""reservations.* and capacity.preview/timeline over HTTP, SQLite and PostgreSQL: to the
in-process app, or to the running coordinator where the reservation clock's loop or NATS
is part of the behaviour. The constraint tables are tests/unit/coordinator/api/test_inputs.py."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import nats

from coordinator.app import Coordinator
from coordinator.ledger import Ledger
from coordinator.services.node_records import record_inventory
from shared.clock import FakeClock
from shared.subjects import Subjects
from shared.wire import Alert
from tests.factories import make_inventory
from tests.integration.conftest import Api, Served
from tests.waiting import eventually

T0 = 1_800_000_000_000


async def _pool(api: Api, ledger: Ledger, nodes: int = 2, gpus: int = 8, **labels: str) -> str:
    await api.ok("tenants.create", {"tenantId": "acme"})
    pool = (await api.ok("pools.create", {"tenantId": "acme", "name": "p"}))["poolId"]
    for i in range(nodes):
        inv = make_inventory(f"n{i}", pool, gpus=gpus, labels={"rack": labels.get(f"n{i}", "r1")})
        await record_inventory(ledger, inv, 1)
    return str(pool)


def req(pool: str, key: str, count: int = 1, **extra: Any) -> dict[str, Any]:
    return {
        "tenantId": "acme",
        "poolId": pool,
        "devices": [{"class": "gpu", "count": count}],
        "duration": "1h",
        "idempotencyKey": key,
    } | extra


async def _gpu(api: Api, pool: str) -> dict[str, int]:
    rows = (await api.ok("capacity.byPool", {"tenantId": "acme", "poolId": pool}))["rows"]
    return next(r for r in rows if r["resource"] == "gpu")


async def test_create_books_updates_the_rollup_and_replays_by_key(served: Served) -> None:
    capi = served.api
    pool = await _pool(capi, served.ledger)
    first = await capi.ok("reservations.create", req(pool, "k1", 3))
    assert first["reservationId"].startswith("rsv_") and first["state"] == "active"
    assert first["start"] == T0 and first["end"] == T0 + 3_600_000
    assert len(first["atoms"]) == 3 and {a["nodeId"] for a in first["atoms"]} == {"n0"}
    gpu = await _gpu(capi, pool)
    assert (gpu["allocated"], gpu["available"]) == (3, 13)
    again = await capi.ok("reservations.create", req(pool, "k1", 3))
    assert again == first
    status, err = await capi.call("reservations.create", req(pool, "k1", 4))
    assert (status, err["error"]["code"]) == (409, "IDEMPOTENCY_KEY_CONFLICT")
    assert (await _gpu(capi, pool))["allocated"] == 3


async def test_a_recorded_409_is_replayed_even_after_capacity_frees(served: Served) -> None:
    capi = served.api
    pool = await _pool(capi, served.ledger, nodes=1)
    held = await capi.ok("reservations.create", req(pool, "hold", 6))
    status, err = await capi.call("reservations.create", req(pool, "big", 4))
    assert (status, err["error"]["code"]) == (409, "CAPACITY_NOT_AVAILABLE")
    device = err["error"]["details"]["devices"][0]
    assert (device["class"], device["requested"], device["available"]) == ("gpu", 4, 2)
    assert "free" in device["reason"]
    await capi.ok(
        "reservations.release", {"tenantId": "acme", "reservationId": held["reservationId"]}
    )
    status2, err2 = await capi.call("reservations.create", req(pool, "big", 4))
    assert (status2, err2) == (status, err)
    assert (await capi.call("reservations.create", req(pool, "big2", 4)))[0] == 200


async def test_preview_is_validated_as_create_is_idempotency_key_included(
    served: Served,
) -> None:
    """Seed 000: preview's input is create's, validated the same way."""
    body = req("pool_" + "0" * 26, "x")
    # Past validation: the (absent) pool is what it answers about.
    status, err = await served.api.call("capacity.preview", body)
    assert status == 404 and err["error"]["code"] == "NOT_FOUND", err
    del body["idempotencyKey"]
    for method in ("capacity.preview", "reservations.create"):
        status, err = await served.api.call(method, body)
        assert status == 400 and err["error"]["details"]["fields"][0]["path"] == "idempotencyKey"


async def test_preview_writes_nothing_and_ranks_at_most_ten_candidates(served: Served) -> None:
    capi = served.api
    pool = await _pool(capi, served.ledger, nodes=12)
    before = await _gpu(capi, pool)
    out = await capi.ok("capacity.preview", req(pool, "p", 2))
    assert out["fits"] is True and len(out["candidates"]) == 10
    assert [c["nodeId"] for c in out["candidates"]] == [
        f"n{i}" for i in (0, 1, 10, 11, 2, 3, 4, 5, 6, 7)
    ]
    assert all(len(c["atoms"]) == 2 and c["score"] > 0 for c in out["candidates"])
    assert await _gpu(capi, pool) == before
    listed = await capi.ok("reservations.list", {"tenantId": "acme"})
    assert listed["reservations"] == []
    # The same key can then be used to book: preview recorded nothing.
    assert (await capi.call("reservations.create", req(pool, "p", 2)))[0] == 200


async def test_preview_gang_members_whole_nodes_and_visibility(served: Served) -> None:
    capi = served.api
    pool = await _pool(capi, served.ledger, nodes=4, n0="a", n1="a", n2="b", n3="b")
    gang = await capi.ok(
        "capacity.preview", req(pool, "g", 8, gang={"size": 2, "topologyKey": "rack"})
    )
    assert gang["fits"] and [c["nodeId"] for c in gang["candidates"]] == ["n0", "n1"]
    no = await capi.ok(
        "capacity.preview", req(pool, "g", 8, gang={"size": 3, "topologyKey": "rack"})
    )
    assert not no["fits"] and no["reason"] == "needs 3 nodes in one rack, best rack a has 2"
    whole = await capi.ok("capacity.preview", req(pool, "w", 1, binding="node"))
    atoms = whole["candidates"][0]["atoms"]
    assert {a["class"] for a in atoms} == {"gpu", "node"} and len(atoms) == 9
    await capi.ok("tenants.create", {"tenantId": "globex"})
    status, err = await capi.call("capacity.preview", req(pool, "g", 1) | {"tenantId": "globex"})
    assert (status, err["error"]["code"]) == (404, "NOT_FOUND")


async def test_spot_is_preempted_with_notice_and_preview_gives_only_a_count(
    capi: Api, clocked: Coordinator, clock: FakeClock
) -> None:
    pool = await _pool(capi, clocked.ledger, nodes=1)
    spot = await capi.ok("reservations.create", req(pool, "s", 8, spot=True))
    preview = await capi.ok("capacity.preview", req(pool, "r", 4))
    assert preview["fits"] is False
    assert preview["preemptible"] == {"count": 1, "startsAt": T0 + 120_000}
    assert "rsv_" not in str(preview)
    nc = await nats.connect(clocked.settings.nats.url)
    notices: list[Alert] = []

    async def on_alert(msg: Any) -> None:
        notices.append(Alert.from_json(msg.data))

    await nc.subscribe(Subjects(clocked.settings.nats.subject_prefix).all_alerts, cb=on_alert)
    await nc.flush()
    regular = await capi.ok("reservations.create", req(pool, "r", 4))
    assert regular["start"] == T0 + 120_000 and regular["state"] == "scheduled"

    async def noticed() -> bool:
        return any(a.kind == "reservation.notice" for a in notices)

    await eventually(noticed)
    await nc.close()
    # Alerts go out from the outbox after their commits: the pool's registrations may
    # arrive after the subscription too.
    notice = next(a for a in notices if a.kind == "reservation.notice")
    assert notice.reservation_id == spot["reservationId"]
    assert notice.details["preemptAt"] == T0 + 120_000
    victim = await capi.ok(
        "reservations.get", {"tenantId": "acme", "reservationId": spot["reservationId"]}
    )
    assert (victim["state"], victim["preemptAt"]) == ("noticed", T0 + 120_000)
    clock.advance(120_001)

    async def preempted() -> bool:
        got = await capi.ok(
            "reservations.get", {"tenantId": "acme", "reservationId": spot["reservationId"]}
        )
        return bool(got["state"] == "preempted")

    await eventually(preempted)

    async def handed_over() -> bool:
        return (await _gpu(capi, pool))["allocated"] == 4

    await eventually(handed_over)


async def test_leases_expire_unless_renewed(
    capi: Api, clocked: Coordinator, clock: FakeClock
) -> None:
    pool = await _pool(capi, clocked.ledger, nodes=1)
    res = await capi.ok("reservations.create", req(pool, "l", 2, leaseSeconds=60))
    assert res["leaseExpiresAt"] == T0 + 60_000
    clock.advance(50_000)
    renewed = await capi.ok(
        "reservations.renew", {"tenantId": "acme", "reservationId": res["reservationId"]}
    )
    assert renewed["leaseExpiresAt"] == T0 + 110_000
    clock.advance(50_000)
    await asyncio.sleep(0.2)
    assert (await _gpu(capi, pool))["allocated"] == 2
    clock.advance(20_000)

    async def freed() -> bool:
        return (await _gpu(capi, pool))["allocated"] == 0

    await eventually(freed)
    got = await capi.ok(
        "reservations.get", {"tenantId": "acme", "reservationId": res["reservationId"]}
    )
    assert got["state"] == "expired"
    status, _ = await capi.call(
        "reservations.renew", {"tenantId": "acme", "reservationId": res["reservationId"]}
    )
    assert status == 400


async def test_the_rollup_follows_time_from_reserved_to_allocated_to_free(
    capi: Api, clocked: Coordinator, clock: FakeClock
) -> None:
    pool = await _pool(capi, clocked.ledger, nodes=1)
    await capi.ok("reservations.create", req(pool, "f", 2, start=T0 + 60_000, duration=600))
    gpu = await _gpu(capi, pool)
    assert (gpu["allocated"], gpu["reserved"], gpu["available"]) == (0, 2, 6)
    clock.advance(60_000)

    async def started() -> bool:
        g = await _gpu(capi, pool)
        return (g["allocated"], g["reserved"]) == (2, 0)

    await eventually(started)
    clock.advance(600_000)

    async def ended() -> bool:
        g = await _gpu(capi, pool)
        return (g["allocated"], g["reserved"], g["available"]) == (0, 0, 8)

    await eventually(ended)


async def test_release_frees_the_rest_at_once_and_list_pages_newest_first(
    served: Served,
) -> None:
    capi, clock = served.api, served.clock
    pool = await _pool(capi, served.ledger, nodes=1)
    ids = []
    for i in range(5):
        ids.append((await capi.ok("reservations.create", req(pool, f"k{i}")))["reservationId"])
        clock.advance(1)
    page = await capi.ok("reservations.list", {"tenantId": "acme", "limit": 2})
    seen = [r["reservationId"] for r in page["reservations"]]
    while page["nextCursor"]:
        page = await capi.ok(
            "reservations.list", {"tenantId": "acme", "limit": 2, "cursor": page["nextCursor"]}
        )
        seen += [r["reservationId"] for r in page["reservations"]]
    assert seen == ids[::-1]
    released = await capi.ok("reservations.release", {"tenantId": "acme", "reservationId": ids[0]})
    assert released["state"] == "released"
    assert (await _gpu(capi, pool))["allocated"] == 4
    await capi.ok("tenants.create", {"tenantId": "globex"})
    status, err = await capi.call(
        "reservations.get", {"tenantId": "globex", "reservationId": ids[1]}
    )
    assert (status, err["error"]["code"]) == (404, "NOT_FOUND")


async def test_quota_per_tenant_pool_and_resource(served: Served) -> None:
    capi = served.api
    pool = await _pool(capi, served.ledger, nodes=2)
    await capi.ok("quotas.set", {"tenantId": "acme", "poolId": pool, "resource": "gpu", "limit": 6})
    await capi.ok("reservations.create", req(pool, "q1", 4))
    status, err = await capi.call("reservations.create", req(pool, "q2", 4))
    assert (status, err["error"]["code"]) == (409, "QUOTA_EXCEEDED")
    assert err["error"]["details"] | {} == {
        "resource": "gpu", "poolId": pool, "limit": 6, "used": 4, "requested": 4,
    }  # fmt: skip
    assert (await capi.call("reservations.create", req(pool, "q3", 2)))[0] == 200


async def test_wait_for_capacity_that_frees_up(served: Served) -> None:
    capi = served.api
    pool = await _pool(capi, served.ledger, nodes=1)
    held = await capi.ok("reservations.create", req(pool, "h", 8))

    async def release_soon() -> None:
        await asyncio.sleep(0.3)
        await capi.ok(
            "reservations.release", {"tenantId": "acme", "reservationId": held["reservationId"]}
        )

    releaser = asyncio.create_task(release_soon())
    status, out = await capi.call(
        "reservations.create", req(pool, "w", 8, wait={"timeoutMs": 5000})
    )
    await releaser
    assert status == 200 and len(out["atoms"]) == 8
    status, err = await capi.call(
        "reservations.create", req(pool, "w2", 1, wait={"timeoutMs": 200})
    )
    assert (status, err["error"]["code"]) == (409, "CAPACITY_NOT_AVAILABLE")


async def test_timeline_defaults_limits_and_free(served: Served) -> None:
    capi = served.api
    pool = await _pool(capi, served.ledger, nodes=1)
    hour = T0 - T0 % 3_600_000
    await capi.ok("reservations.create", req(pool, "t", 3, start=hour + 3_600_000, duration="2h"))
    out = await capi.ok("capacity.timeline", {"tenantId": "acme", "poolId": pool})
    assert (out["from"], out["to"], out["stepMinutes"]) == (hour, hour + 86_400_000, 60)
    assert out["allocatable"] == 8 and len(out["buckets"]) == 24
    assert [b["booked"] for b in out["buckets"][:4]] == [0, 3, 3, 0]
    assert out["buckets"][1]["free"] == 5
    base = {"tenantId": "acme", "poolId": pool}
    # The window's rules (tests/unit/coordinator/api/test_inputs.py) reach the wire as the envelope.
    status, err = await capi.call("capacity.timeline", base | {"from": hour, "to": hour})
    assert (status, err["error"]["code"]) == (400, "INVALID_INPUT")
    assert [f["path"] for f in err["error"]["details"]["fields"]] == ["to"]
    week = await capi.ok(
        "capacity.timeline", base | {"from": hour, "to": hour + 7 * 86_400_000, "stepMinutes": 30}
    )
    assert len(week["buckets"]) == 336


async def test_concurrent_duplicates_commit_once(served: Served) -> None:
    capi = served.api
    pool = await _pool(capi, served.ledger, nodes=2)
    answers = await asyncio.gather(
        *(capi.call("reservations.create", req(pool, "same", 2)) for _ in range(10))
    )
    assert {status for status, _ in answers} == {200}
    assert len({body["reservationId"] for _, body in answers}) == 1
    listed = await capi.ok("reservations.list", {"tenantId": "acme"})
    assert len(listed["reservations"]) == 1
    assert (await _gpu(capi, pool))["allocated"] == 2


async def test_a_gang_books_every_member_or_nothing(served: Served) -> None:
    capi = served.api
    pool = await _pool(capi, served.ledger, nodes=3, n0="a", n1="a", n2="b")
    gang = {"size": 2, "topologyKey": "rack"}
    out = await capi.ok("reservations.create", req(pool, "g1", 8, gang=gang))
    assert {a["nodeId"] for a in out["atoms"]} == {"n0", "n1"} and len(out["atoms"]) == 16
    assert out["gang"] == gang
    status, err = await capi.call("reservations.create", req(pool, "g2", 8, gang=gang))
    assert status == 409
    assert err["error"]["message"] == "needs 2 nodes in one rack, best rack b has 1"
    assert (await _gpu(capi, pool))["allocated"] == 16


async def test_wait_for_a_node_to_come_back(served: Served) -> None:
    capi = served.api
    pool = await _pool(capi, served.ledger, nodes=1)
    await capi.ok("nodes.setMaintenance", {"nodeId": "n0", "maintenance": True, "reason": "x"})

    async def back_soon() -> None:
        await asyncio.sleep(0.3)
        await capi.ok("nodes.setMaintenance", {"nodeId": "n0", "maintenance": False})

    returner = asyncio.create_task(back_soon())
    status, out = await capi.call(
        "reservations.create", req(pool, "wn", 2, wait={"timeoutMs": 5000})
    )
    await returner
    assert status == 200 and {a["nodeId"] for a in out["atoms"]} == {"n0"}


async def test_a_released_future_booking_frees_quota_timeline_and_reserved(served: Served) -> None:
    capi = served.api
    pool = await _pool(capi, served.ledger, nodes=1)
    await capi.ok("quotas.set", {"tenantId": "acme", "poolId": pool, "resource": "gpu", "limit": 8})
    hour = T0 - T0 % 3_600_000
    later = await capi.ok(
        "reservations.create", req(pool, "f1", 8, start=hour + 7_200_000 + 600_000, duration="1h")
    )
    assert (await _gpu(capi, pool))["reserved"] == 8
    await capi.ok(
        "reservations.release", {"tenantId": "acme", "reservationId": later["reservationId"]}
    )
    gpu = await _gpu(capi, pool)
    assert (gpu["reserved"], gpu["available"]) == (0, 8)
    timeline = await capi.ok("capacity.timeline", {"tenantId": "acme", "poolId": pool})
    assert all(b["booked"] == 0 for b in timeline["buckets"])
    wider = req(pool, "f2", 8, start=hour + 7_200_000, duration="3h")
    assert (await capi.call("reservations.create", wider))[0] == 200
    assert await served.ledger.rebuild_all(T0) == 0


async def test_a_spot_reservation_ending_before_the_notice_is_not_preempted(served: Served) -> None:
    capi = served.api
    pool = await _pool(capi, served.ledger, nodes=1)
    short = await capi.ok("reservations.create", req(pool, "s", 8, spot=True, duration=60))
    preview = await capi.ok("capacity.preview", req(pool, "r", 8))
    assert preview["preemptible"] == {"count": 0, "startsAt": T0 + 120_000}
    regular = await capi.ok("reservations.create", req(pool, "r", 8))
    assert regular["start"] == T0 + 120_000
    got = await capi.ok(
        "reservations.get", {"tenantId": "acme", "reservationId": short["reservationId"]}
    )
    assert got["state"] == "active" and "preemptAt" not in got


async def test_a_start_off_the_millisecond_grid_is_invalid_input_and_books_nothing(
    served: Served,
) -> None:
    """The compute API's times are integer milliseconds: a fraction, however small, is
    `INVALID_INPUT` naming `start`, never rounded (JSON would read `.0000001` as the
    float's nearest value, the whole millisecond itself)."""
    capi = served.api
    pool = await _pool(capi, served.ledger, nodes=1)
    start = T0 + 3_600_000
    for value in (f"{start}.0000001", f"{start}.000000999", f"{start}.5", f"{start}.0"):
        raw = json.dumps(req(pool, "off")).replace('"duration"', f'"start": {value}, "duration"')
        for method in ("reservations.create", "capacity.preview"):
            status, err = await capi.call(method, None, raw=raw.encode())
            assert (status, err["error"]["code"]) == (400, "INVALID_INPUT"), (method, value)
            assert [f["path"] for f in err["error"]["details"]["fields"]] == ["start"]
    listed = await capi.ok("reservations.list", {"tenantId": "acme"})
    assert listed["reservations"] == []
    assert (await _gpu(capi, pool))["reserved"] == 0
    # The key recorded nothing: the same key with a whole-millisecond start books.
    await capi.ok("reservations.create", req(pool, "off", start=start))
