"""`usage.export` (SPEC §13, issue 35): FOCUS 1.2 rows of memory reserved against used,
streamed as CSV over HTTP, on SQLite and PostgreSQL, and as the CLI's Parquet. Every
row is checked against FOCUS's column rules (types, nullability, allowed values, the
capacity reservation rule) and the quantities and costs add up to the consumption
API's totals to the cent."""

from __future__ import annotations

import csv
import io
import json
import re
import tempfile
from datetime import datetime
from decimal import Decimal
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from coordinator.api.app import build_app
from coordinator.api.http.context import Services
from coordinator.domain.consumption import MemoryAccrued, MemoryKey
from coordinator.domain.focus import COLUMNS
from coordinator.domain.gpu_use_accrual import AccrualKey, AccrualWho, Accrued
from coordinator.domain.intervals import INTERVAL_MS as Q
from coordinator.domain.rate_card import parse_rate_card
from coordinator.services.node_records import record_inventory
from ops.cli.focus_parquet import DECIMALS, TIMES, csv_to_parquet
from tests.factories import make_inventory
from tests.integration.conftest import Served
from tests.integration.coordinator.api.test_consumption import GIB_Q, S, _fleet, _get
from tests.integration.coordinator.api.test_intervals import iso

CARD = parse_rate_card(
    """currency = "EUR"
[[rate]]
resource = "memory_gb"
model = "*"
reserved = "0.0125"
on_demand = "0.0300"
effective_from = 2020-01-01
[[rate]]
resource = "gpu"
model = "*"
reserved = "2.00"
on_demand = "3.00"
effective_from = 2020-01-01
""",
    "rates.toml",
)
TIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")
DECIMAL = re.compile(r"^-?\d+(\.\d+)?$")
NOT_NULL = {
    "BillingAccountId", "BillingCurrency", "BillingPeriodStart", "BillingPeriodEnd",
    "ChargePeriodStart", "ChargePeriodEnd", "ChargeCategory", "ChargeDescription",
    "ListCost", "BilledCost", "EffectiveCost", "ContractedCost", "ProviderName",
    "ServiceName", "ServiceCategory", "PricingCategory",
}  # fmt: skip


def check_focus_row(row: dict[str, str]) -> None:
    """FOCUS 1.2's rules for the columns the export carries ("" is null in CSV)."""
    for col in NOT_NULL:
        assert row[col] != "", (col, row)
    for col in ("BillingPeriodStart", "BillingPeriodEnd", "ChargePeriodStart", "ChargePeriodEnd"):
        assert TIME.match(row[col]), (col, row[col])
    assert row["ChargePeriodStart"] < row["ChargePeriodEnd"]
    assert row["BillingPeriodStart"] <= row["ChargePeriodStart"]
    assert row["ChargePeriodEnd"] <= row["BillingPeriodEnd"]
    assert row["ChargeCategory"] in {"Usage", "Purchase", "Tax", "Credit", "Adjustment"}
    assert row["PricingCategory"] in {"Standard", "Dynamic", "Committed", "Other"}
    assert re.match(r"^[A-Z]{3}$", row["BillingCurrency"])
    for col in ("ListCost", "BilledCost", "EffectiveCost", "ContractedCost"):
        assert DECIMAL.match(row[col]), (col, row[col])
    # ConsumedQuantity/Unit are not null for Usage; PricingQuantity/Unit go together.
    assert row["ChargeCategory"] != "Usage" or (row["ConsumedQuantity"] and row["ConsumedUnit"])
    for col in ("ConsumedQuantity", "PricingQuantity"):
        assert DECIMAL.match(row[col]) and Decimal(row[col]) >= 0, (col, row[col])
    assert bool(row["PricingQuantity"]) == bool(row["PricingUnit"])
    # CapacityReservationStatus: null exactly when CapacityReservationId is; Used/Unused.
    if row["CapacityReservationId"] == "":
        assert row["CapacityReservationStatus"] == ""
    else:
        assert row["CapacityReservationStatus"] in {"Used", "Unused"}
    assert isinstance(json.loads(row["Tags"]), dict)
    datetime.fromisoformat(row["ChargePeriodStart"].replace("Z", "+00:00"))


async def _export(
    client: TestClient[web.Request, web.Application], key: str, body: dict[str, Any]
) -> tuple[int, Any]:
    async with client.session.post(
        str(client.make_url("/api/compute/usage/export")),
        json=body,
        headers={"Authorization": f"Bearer {key}"},
    ) as resp:
        if resp.content_type == "application/json":
            return resp.status, await resp.json()
        assert resp.content_type == "text/csv"
        return resp.status, await resp.text()


async def test_the_export_follows_focus_and_adds_up_to_the_api(served: Served) -> None:
    keys = await _fleet(served)
    api = served.api
    window = {"from": S, "to": S + 4 * Q}
    _, whole = await _get(api, api.operator_key, **{"from": iso(S), "to": iso(S + 4 * Q)})
    totals = whole["totals"]
    app = build_app(Services(served.ledger, served.clock, rate_card=CARD))
    async with TestClient(TestServer(app)) as client:
        status, text = await _export(client, api.operator_key, window)
        assert status == 200, text
        reader = csv.DictReader(io.StringIO(text))
        assert tuple(reader.fieldnames or ()) == COLUMNS
        rows = list(reader)
        for row in rows:
            check_focus_row(row)
        assert parquet_rows(text) == rows  # the CLI's focus-parquet: the same rows, typed
        rows = [r for r in rows if r["ConsumedUnit"] == "GB-Hours"]  # memory's rows
        by: dict[str, Decimal] = {"Used": Decimal(0), "Unused": Decimal(0), "": Decimal(0)}
        cost = Decimal(0)
        for row in rows:
            by[row["CapacityReservationStatus"]] += Decimal(row["ConsumedQuantity"])
            cost += Decimal(row["BilledCost"])
        assert by["Used"] == Decimal(str(totals["coveredGbHours"]))
        assert by["Unused"] == Decimal(str(totals["unusedGbHours"]))
        assert by[""] == Decimal(str(totals["onDemandGbHours"]))
        expected = (by["Used"] + by["Unused"]) * Decimal("0.0125") + by[""] * Decimal("0.03")
        assert cost.quantize(Decimal("0.01")) == expected.quantize(Decimal("0.01"))
        assert {r["BillingCurrency"] for r in rows} == {"EUR"}
        assert [r["SubAccountId"] for r in rows if r["CapacityReservationStatus"] == ""] == [
            "", "beta", "acme",
        ]  # fmt: skip
        # A tenant exports its own rows only; a bad window names its field, writes nothing.
        status, mine = await _export(client, keys["beta"], window | {"tenantId": "beta"})
        assert status == 200 and {r["SubAccountId"] for r in csv.DictReader(io.StringIO(mine))} == {
            "beta"
        }
        status, body = await _export(client, keys["beta"], window | {"tenantId": "acme"})
        assert status == 403, body
        for bad, field in (({"from": S + 1}, "from"), ({"to": S}, "to"),
                           ({"to": S + 36 * 24 * 4 * Q}, "to")):  # fmt: skip
            status, body = await _export(client, api.operator_key, window | bad)
            assert status == 400 and body["error"]["code"] == "INVALID_INPUT", body
            assert [f["path"] for f in body["error"]["details"]["fields"]] == [field], body


async def test_without_a_rate_card_the_export_is_quantities_only(served: Served) -> None:
    await _fleet(served)
    async with TestClient(TestServer(build_app(Services(served.ledger, served.clock)))) as client:
        status, text = await _export(client, served.api.operator_key, {"from": S, "to": S + 4 * Q})
    rows = list(csv.DictReader(io.StringIO(text)))
    assert status == 200 and rows
    for row in rows:
        check_focus_row(row)
    assert {(r["BillingCurrency"], Decimal(r["BilledCost"])) for r in rows} == {("XXX", Decimal(0))}


async def test_device_bookings_are_rows_per_hour_used_and_unused(served: Served) -> None:
    """One GPU booked for the hour: used 30 minutes, 10 of them idle (counted unused),
    and a quarter-hour of another GPU's use no booking covered, on demand."""
    keys = await _fleet(served)
    api, pool = served.api, keys["pool"]
    booked = await api.ok(
        "reservations.create",
        {"tenantId": "acme", "poolId": pool, "devices": [{"class": "gpu", "count": 1}],
         "start": S, "duration": "2h", "idempotencyKey": "gpu-1"},
        keys["acme"],
    )  # fmt: skip
    rid, atom = booked["reservationId"], booked["atoms"][0]["atomId"]
    m = 60_000
    await served.ledger.gpu_use.record(
        {
            AccrualKey(S, rid, "n0", atom, "gpu", "acme"): Accrued(
                AccrualWho(pool, None), 30 * m, 30 * m // 2, 0, 10 * m
            ),
            AccrualKey(S, "", "n0", "GPU-other", "gpu", ""): Accrued(
                AccrualWho(pool, None), 15 * m, 15 * m, 0, 0
            ),
            # beta's process on a GPU no booking held: beta's use on demand.
            AccrualKey(S, "", "n0", "GPU-third", "gpu", "beta"): Accrued(
                AccrualWho(pool, None), 6 * m, 6 * m, 0, 0
            ),
        },
        [],
        [],
    )
    served.clock.advance(3 * 3_600_000)
    window = {"from": S, "to": S + 4 * Q}
    status, used = await api.call("usage.consumption", window)
    assert status == 200, used
    (row,) = used["reservations"]
    assert (row["bookedHours"], row["usedHours"], row["idleHours"], row["unusedHours"]) == (
        1.0, 0.333333, 0.166667, 0.666667,
    )  # fmt: skip
    assert used["onDemand"] == [
        {"tenantId": None, "poolId": pool, "usedHours": 0.25},
        {"tenantId": "beta", "poolId": pool, "usedHours": 0.1},
    ]
    status, own = await api.call("usage.consumption", window | {"tenantId": "beta"}, keys["beta"])
    assert status == 200 and own["onDemand"] == [
        {"tenantId": "beta", "poolId": pool, "usedHours": 0.1}
    ], own
    app = build_app(Services(served.ledger, served.clock, rate_card=CARD))
    async with TestClient(TestServer(app)) as client:
        status, text = await _export(client, api.operator_key, window)
    assert status == 200, text
    rows = [r for r in csv.DictReader(io.StringIO(text)) if r["ConsumedUnit"] == "GPU-Hours"]
    for r in rows:
        check_focus_row(r)
    got = {
        (r["CapacityReservationId"], r["CapacityReservationStatus"], r["SubAccountId"]): (
            round(Decimal(r["ConsumedQuantity"]), 6), round(Decimal(r["BilledCost"]), 2),
            r["SubAccountId"], r["ChargePeriodStart"], r["ChargePeriodEnd"],
        )
        for r in rows
    }  # fmt: skip
    hour = (iso(S), iso(S + 3_600_000))
    assert got == {
        (rid, "Used", "acme"): (Decimal("0.333333"), Decimal("0.67"), "acme", *hour),
        (rid, "Unused", "acme"): (Decimal("0.666667"), Decimal("1.33"), "acme", *hour),
        ("", "", ""): (Decimal("0.25"), Decimal("0.75"), "", *hour),
        ("", "", "beta"): (Decimal("0.1"), Decimal("0.30"), "beta", *hour),
    }


def parquet_rows(text: str) -> list[dict[str, str]]:
    """The export as `gpufleet usage export --format focus-parquet` writes it, read back:
    FOCUS's types checked per column, then each row as CSV text for `check_focus_row`."""
    import pyarrow.parquet as pq

    with tempfile.TemporaryDirectory() as tmp:
        target = f"{tmp}/focus.parquet"
        assert csv_to_parquet(io.BytesIO(text.encode()), target) == text.count("\r\n") - 1
        table = pq.read_table(target)
    types = {f.name: str(f.type) for f in table.schema}
    assert tuple(types) == COLUMNS
    want = dict.fromkeys(TIMES, "timestamp[ms, tz=UTC]") | dict.fromkeys(
        DECIMALS, "decimal128(38, 10)"
    )
    for col in COLUMNS:
        assert types[col] == want.get(col, "string"), (col, types[col])
    rows = []
    for record in table.to_pylist():
        cells = {}
        for col, value in record.items():
            if value is None:
                cells[col] = ""
            elif isinstance(value, datetime):
                assert value.utcoffset() is not None and not value.utcoffset()
                cells[col] = value.strftime("%Y-%m-%dT%H:%M:%SZ")
            else:
                assert isinstance(value, str | Decimal), (col, value)
                cells[col] = format(value, "f") if isinstance(value, Decimal) else value
        rows.append(cells)
    return rows


async def test_rows_name_the_interval_reservations_and_the_nodes_place(served: Served) -> None:
    """Two interval reservations of one quarter: use fills the older first, each row
    names its own; RegionId and AvailabilityZone are the nodes' topology labels; the
    Parquet file holds the same rows, typed, each within FOCUS's rules."""
    api, ledger = served.api, served.ledger
    await api.ok("tenants.create", {"tenantId": "acme"})
    pool = (await api.ok("pools.create", {"tenantId": "acme", "name": "p"}))["poolId"]
    where = {
        "topology.kubernetes.io/region": "eu-west",
        "topology.kubernetes.io/zone": "eu-west-1a",
    }
    for n, node in enumerate(("n0", "n1")):
        await record_inventory(
            ledger, make_inventory(node, pool, memory_gib=512, labels=where), n + 1
        )
    key = (await api.ok("apiKeys.create", {"tenantId": "acme"}))["key"]
    ids = []
    for gb in (16, 8):
        body = {"intervals": [{"startsAt": iso(S), "endsAt": iso(S + Q), "capacityGb": gb}],
                "poolId": pool}  # fmt: skip
        async with api.session.post(
            f"{api.base}/api/capacity/reservations", json=body, headers={"X-API-Key": key}
        ) as resp:
            assert resp.status == 200, await resp.text()
            ids.append((await resp.json())["reservationId"])
        served.clock.advance(1)
    await ledger.gpu_use.record(
        {}, [], [], memory={MemoryKey(S, "acme", pool): MemoryAccrued(20 * GIB_Q, 20 * 1024)}
    )
    app = build_app(Services(ledger, served.clock, rate_card=CARD))
    async with TestClient(TestServer(app)) as client:
        status, text = await _export(client, api.operator_key, {"from": S, "to": S + Q})
    assert status == 200, text
    rows = list(csv.DictReader(io.StringIO(text)))
    for row in rows:
        check_focus_row(row)
    assert [(r["CapacityReservationId"], r["CapacityReservationStatus"], r["ConsumedQuantity"],
             r["RegionId"], r["AvailabilityZone"]) for r in rows] == [
        (ids[0], "Used", "4.0000000000", "eu-west", "eu-west-1a"),
        (ids[1], "Used", "1.0000000000", "eu-west", "eu-west-1a"),
        (ids[1], "Unused", "1.0000000000", "eu-west", "eu-west-1a"),
    ]  # fmt: skip
    typed = parquet_rows(text)
    for row in typed:
        check_focus_row(row)
    assert typed == rows
