"""The HTTP API against a hostile or careless client, on SQLite and PostgreSQL: every
input that used to be a 500 (or a wrong 400) is a clear 4xx that changes nothing."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from pathlib import Path
from typing import Any

import pytest

from coordinator.app import Coordinator, running_coordinator
from coordinator.services.node_records import record_inventory
from shared.clock import FakeClock
from tests.connections import closed
from tests.factories import make_inventory
from tests.integration.conftest import Api, coordinator_settings
from tests.waiting import eventually

T0 = 1_800_000_000_000


def cursor(value: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


async def raw_http(port: int, request: bytes, pieces: int = 1, pause_s: float = 0.05) -> bytes:
    """Send `request` over one TCP connection in `pieces` writes; the whole answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        step = -(-len(request) // pieces)
        for i in range(0, len(request), step):
            writer.write(request[i : i + step])
            await writer.drain()
            await asyncio.sleep(pause_s)
        return await asyncio.wait_for(reader.read(), timeout=10)
    finally:
        await closed(writer)


def post(path: str, body: bytes, key: str, extra: str = "") -> bytes:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nConnection: close\r\n{extra}"
    )
    if "Transfer-Encoding" not in extra:
        head += f"Content-Length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + body


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


async def test_a_body_split_over_tcp_writes_is_read_whole_and_oversize_is_413(
    api: Api, coordinator: Coordinator
) -> None:
    key = api.operator_key
    await api.ok("tenants.create", {"tenantId": "acme"})
    # ~200 KB of valid JSON (padding is whitespace), sent in 16 KiB pieces.
    body = b'{"tenantId":' + b" " * 200_000 + b'"acme"}'
    answer = await raw_http(
        coordinator.http.port, post("/api/compute/capacity/summary", body, key), pieces=13
    )
    assert status_of(answer) == 200, answer[-300:]
    # Chunked, no Content-Length, 3 MB: the limit still holds.
    big = b'{"tenantId": "acme", "x": "' + b"a" * 3_000_000 + b'"}'
    chunked = b"".join(
        f"{len(big[i : i + 65536]):x}\r\n".encode() + big[i : i + 65536] + b"\r\n"
        for i in range(0, len(big), 65536)
    )
    answer = await raw_http(
        coordinator.http.port,
        post("/api/compute/capacity/summary", chunked + b"0\r\n\r\n", key,
             "Transfer-Encoding: chunked\r\n"),
    )  # fmt: skip
    assert status_of(answer) == 413
    assert b"PAYLOAD_TOO_LARGE" in answer


async def dribble(writer: asyncio.StreamWriter) -> None:
    """One more byte of body every 100 ms, for ever (a slow-body client)."""
    while True:
        await asyncio.sleep(0.1)
        writer.write(b" ")
        await writer.drain()


async def test_a_stalled_or_trickled_body_is_408_within_the_body_timeout(
    tmp_path: Path, nats_url: str
) -> None:
    """A client that sends its headers and then holds the body back (all at once, or a
    byte at a time) gets 408 once `http_body_timeout_s` has passed, not a handler that
    waits for ever."""
    settings = coordinator_settings(
        f"sqlite:///{tmp_path / 'ledger.db'}", nats_url, http_body_timeout_s=0.5
    )
    async with running_coordinator(settings) as c:
        key = c.settings.bootstrap_operator_key
        assert key is not None
        head = post("/api/compute/capacity/summary", b"", key).replace(
            b"Content-Length: 0", b"Content-Length: 100"
        )
        for trickle in (False, True):
            reader, writer = await asyncio.open_connection("127.0.0.1", c.http.port)
            dribbling = asyncio.create_task(dribble(writer)) if trickle else None
            try:
                writer.write(head + b'{"tenantId"')
                await writer.drain()
                started = time.monotonic()
                answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
                assert status_of(answer) == 408, (trickle, answer)
                assert time.monotonic() - started < 3, trickle
            finally:
                if dribbling is not None:
                    dribbling.cancel()
                    await asyncio.gather(dribbling, return_exceptions=True)
                await closed(writer)


async def test_malformed_json_is_invalid_input_never_500(api: Api) -> None:
    await api.ok("tenants.create", {"tenantId": "acme"})
    cases = {
        "duplicate key": b'{"tenantId": "acme", "tenantId": "globex"}',
        "deeply nested": b'{"tenantId": "acme", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        "NaN": b'{"tenantId": "acme", "x": NaN}',
        "lone surrogate": b'{"tenantId": "\\ud800"}',
    }
    for what, raw in cases.items():
        status, body = await api.call("capacity.summary", None, raw=raw)
        assert status == 400, (what, body)
        assert body["error"]["code"] == "INVALID_INPUT", what


async def test_nul_bytes_and_surrogates_are_refused_before_any_write(api: Api) -> None:
    """PostgreSQL cannot store NUL in text: that used to be a 500 after the checks."""
    await api.ok("tenants.create", {"tenantId": "acme"})
    for method, body in [
        ("tenants.create", {"tenantId": "globex", "name": "Glo\x00bex"}),
        ("tenants.create", {"tenantId": "initech", "name": "Ini\ud800tech"}),
        ("apiKeys.create", {"tenantId": "acme", "label": "ci\x00"}),
        ("pools.create", {"tenantId": "acme", "name": "p", "gpuModel": "H100\x00"}),
        ("nodes.setMaintenance", {"nodeId": "n1", "maintenance": True, "reason": "x\x00y"}),
    ]:
        raw = json.dumps(body).encode()
        status, out = await api.call(method, None, raw=raw)
        assert status == 400, (method, out)
        assert out["error"]["code"] == "INVALID_INPUT"
    status, _ = await api.call("tenants.create", {"tenantId": "globex"})
    assert status == 200  # nothing of the refused one was committed
    listed = await api.ok("pools.list", {"tenantId": "acme"})
    assert listed["pools"] == []


async def test_forged_cursors_and_huge_ids_are_400(api: Api) -> None:
    await api.ok("tenants.create", {"tenantId": "acme"})
    for forged in ([1e999, "x"], [1e30, "x"], [2**63, "x"], [True, "x"], [-1, "x"], [1, "\x00"]):
        status, out = await api.call(
            "reservations.list", {"tenantId": "acme", "cursor": cursor(forged)}
        )
        assert status == 400, (forged, out)
    status, out = await api.call("nodes.list", {"tenantId": "acme", "poolId": "pool_" + "0" * 26,
                                               "cursor": cursor(["x"])})  # fmt: skip
    assert status in (400, 404), out
    status, out = await api.call(
        "nodes.events", {"tenantId": "acme", "nodeId": "n1", "after": 2**63}
    )
    assert status == 400, out


async def test_wrong_verb_is_405_coded_as_such_and_answers_carry_security_headers(
    api: Api,
) -> None:
    async with api.session.get(f"{api.base}/api/compute/capacity/summary") as resp:
        assert resp.status == 405
        body = await resp.json()
        assert body["error"]["code"] == "METHOD_NOT_ALLOWED"
        assert "POST" in resp.headers["Allow"]
    await api.ok("tenants.create", {"tenantId": "acme"})
    async with api.session.post(
        f"{api.base}/api/compute/apiKeys/create",
        json={"tenantId": "acme"},
        headers={"Authorization": f"Bearer {api.operator_key}"},
    ) as resp:
        assert resp.status == 200
        assert resp.headers["Cache-Control"] == "no-store"
        assert resp.headers["Server"] == "gpufleet"
        assert resp.headers["X-Content-Type-Options"] == "nosniff"
        assert "frame-ancestors 'none'" in resp.headers["Content-Security-Policy"]


async def test_metrics_need_their_token_or_an_operator_key(api: Api) -> None:
    await api.ok("tenants.create", {"tenantId": "acme"})
    tenant_key = (await api.ok("apiKeys.create", {"tenantId": "acme"}))["key"]
    for headers in ({}, {"Authorization": f"Bearer {tenant_key}"}, {"Authorization": "Bearer x"}):
        async with api.session.get(f"{api.base}/metrics", headers=headers) as resp:
            assert resp.status == 401
            assert "gpufleet_rollup" not in await resp.text()
    operator = {"Authorization": f"Bearer {api.operator_key}"}
    async with api.session.get(f"{api.base}/metrics", headers=operator) as resp:
        assert resp.status == 200


async def test_tenants_see_maintenance_by_the_operator_not_its_key(
    api: Api, coordinator: Coordinator
) -> None:
    await api.ok("tenants.create", {"tenantId": "acme"})
    pool = (await api.ok("pools.create", {"tenantId": "acme", "name": "p"}))["poolId"]
    await record_inventory(coordinator.ledger, make_inventory("n1", pool), 1)
    await api.ok("nodes.setMaintenance", {"nodeId": "n1", "maintenance": True, "reason": "fw"})
    key = (await api.ok("apiKeys.create", {"tenantId": "acme"}))["key"]
    node = await api.ok("nodes.get", {"tenantId": "acme", "nodeId": "n1"}, key=key)
    assert node["state"]["maintenance"]["by"] == "operator"
    events = await api.ok("nodes.events", {"tenantId": "acme", "nodeId": "n1"}, key=key)
    assert "operator/" not in json.dumps(events)
    seen_by_operator = await api.ok("nodes.get", {"tenantId": "acme", "nodeId": "n1"})
    assert seen_by_operator["state"]["maintenance"]["by"].startswith("operator/")
    # A pool the tenant cannot see is NOT_FOUND, not an empty page.
    await api.ok("tenants.create", {"tenantId": "globex"})
    other = (await api.ok("pools.create", {"tenantId": "globex", "name": "g"}))["poolId"]
    status, out = await api.call("reservations.list", {"tenantId": "acme", "poolId": other}, key)
    assert status == 404, out


async def test_the_console_alert_feed_shows_tenants_the_operator_not_its_key(
    api: Api, coordinator: Coordinator
) -> None:
    """The console's alert feed is the same fact as `maintenance.by`: a tenant sees that
    the operator put its node in maintenance, never the operator's key id."""
    await api.ok("tenants.create", {"tenantId": "acme"})
    pool = (await api.ok("pools.create", {"tenantId": "acme", "name": "p"}))["poolId"]
    await record_inventory(coordinator.ledger, make_inventory("n1", pool), 1)
    key = (await api.ok("apiKeys.create", {"tenantId": "acme"}))["key"]
    await api.ok("nodes.setMaintenance", {"nodeId": "n1", "maintenance": True, "reason": "fw"})
    operator_key_id = api.operator_key.split("_")[1]

    async def feed(as_key: str) -> list[dict[str, Any]]:
        headers = {"Authorization": f"Bearer {as_key}"}
        async with api.session.get(f"{api.base}/api/console/alerts", headers=headers) as resp:
            assert resp.status == 200
            alerts: list[dict[str, Any]] = (await resp.json())["alerts"]
            return [a for a in alerts if a["kind"] == "node.maintenance"]

    async def arrived() -> bool:
        return bool(await feed(key))

    await eventually(arrived)
    seen = await feed(key)
    assert [a["by"] for a in seen] == ["operator"], seen
    assert operator_key_id not in json.dumps(seen)
    assert [a["by"] for a in await feed(api.operator_key)] == [f"operator/{operator_key_id}"]


@pytest.fixture
async def interval_key(capi: Api, clocked: Coordinator) -> str:
    await capi.ok("tenants.create", {"tenantId": "acme"})
    pool = (await capi.ok("pools.create", {"tenantId": "acme", "name": "p"}))["poolId"]
    await record_inventory(clocked.ledger, make_inventory("n1", pool, memory_gib=512), 1)
    key: str = (await capi.ok("apiKeys.create", {"tenantId": "acme"}))["key"]
    return key


async def test_interval_api_answers_hostile_input_with_plain_400_and_commits_nothing(
    capi: Api, clocked: Coordinator, clock: FakeClock, interval_key: str
) -> None:
    headers = {"X-API-Key": interval_key}
    url = f"{capi.base}/api/capacity/reservations"

    def one(starts: str, ends: str) -> bytes:
        iv = {"startsAt": starts, "endsAt": ends, "capacityGb": 16}
        return json.dumps({"intervals": [iv]}).encode()

    bodies = [
        b'{"intervals": [], "intervals": []}',
        b"[" * 100_000 + b"]" * 100_000,
        b'{"poolId": "\\ud800", "intervals": []}',
        one("9999-12-31T23:30:00-14:00", "9999-12-31T23:45:00-14:00"),
        one("0001-01-01T00:00:00+01:00", "0001-01-01T00:15:00+01:00"),
        one("9999-12-31T23:45:00+00:00", "10000-01-01T00:00:00+00:00"),
    ]
    for raw in bodies:
        async with capi.session.post(url, data=raw, headers=headers) as resp:
            assert resp.status == 400, (raw[:80], await resp.text())
            assert resp.content_type == "text/plain"
    for frm, to in [("0001-01-01T00:00:00+01:00", "0001-01-02T00:00:00+01:00"),
                    ("9999-12-31T00:00:00-14:00", "9999-12-31T23:45:00-14:00")]:  # fmt: skip
        async with capi.session.get(url, params={"from": frm, "to": to}, headers=headers) as resp:
            assert resp.status == 400, await resp.text()
    for forged in ([1e999, "x"], [1e30, "x"], [2**63, "x"], [True, "x"]):
        params = {"from": "2027-01-01T00:00:00Z", "to": "2027-01-02T00:00:00Z"}
        params["cursor"] = cursor(forged)
        async with capi.session.get(url, params=params, headers=headers) as resp:
            assert resp.status == 400, (forged, await resp.text())
            assert resp.content_type == "text/plain"
    params = {"from": "2027-01-01T00:00:00Z", "to": "2027-01-30T00:00:00Z"}
    async with capi.session.get(url, params=params, headers=headers) as resp:
        assert resp.status == 200
        assert (await resp.json())["reservations"] == []
