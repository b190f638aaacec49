"""Property-based fuzzing of a live coordinator (a real process on SQLite and on
PostgreSQL, a real simulated agent, real NATS): hostile inputs to every method, the
served OpenAPI document driven by schemathesis, and hostile payloads on the bus.

Each property: no 500, no hang (every answer within a timeout), nothing committed by
a refused request (the ledger's rows are the same before and after any 4xx), and on
the bus, the honest node keeps its health and reachability. Budgets are bounded so
the module runs in well under a minute per backend.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgspec
import nats
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coordinator.api.methods import REGISTRY
from ops.kit.client import ApiClient
from ops.kit.embedded_nats import EmbeddedNats, free_port
from ops.kit.keys import new_key
from shared.subjects import Subjects
from shared.wire import Heartbeat, Inventory
from tests.conftest import PG_ADMIN_URL, PG_REQUIRED, _asyncpg_dsn, _pg_execute, postgres_available
from tests.e2e.fleet_procs import BIN, stop, wait_for

pytestmark = pytest.mark.e2e

FUZZ = settings(
    max_examples=int(os.environ.get("GPUFLEET_FUZZ_EXAMPLES", "120")),
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
    database=None,
)
ANSWER_TIMEOUT_S = 10
PREFIX = "fuzz"
# Rows a refused request must not change (counts, and the flags 4xx answers must
# not flip); tables the clock or agents move on their own are left out.
FINGERPRINT = [
    "SELECT count(*) FROM tenants",
    "SELECT count(*) FROM api_keys WHERE revoked_at IS NULL",
    "SELECT count(*) FROM pools",
    "SELECT count(*) FROM pools WHERE archived",
    "SELECT count(*) FROM pool_offers",
    'SELECT count(*), coalesce(sum("limit"), 0) FROM quotas',
    "SELECT count(*) FROM reservations",
    "SELECT count(*) FROM interval_reservations",
    "SELECT count(*) FROM nodes WHERE maintenance",
]


@dataclass
class Live:
    port: int
    operator_key: str
    tenant_key: str
    pool_id: str
    nats_url: str
    database_url: str

    def post(self, path: str, raw: bytes, key: str, headers: dict[str, str] | None = None) -> int:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=ANSWER_TIMEOUT_S)
        try:
            conn.request(
                "POST",
                path,
                body=raw,
                headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
                | (headers or {}),
            )
            resp = conn.getresponse()
            resp.read()
            return resp.status
        finally:
            conn.close()

    def fingerprint(self) -> list[Any]:
        if self.database_url.startswith("sqlite:///"):
            with sqlite3.connect(self.database_url.removeprefix("sqlite:///")) as db:
                return [tuple(db.execute(q).fetchone()) for q in FINGERPRINT]
        return asyncio.run(self._pg_fingerprint())

    async def _pg_fingerprint(self) -> list[Any]:
        import asyncpg

        conn = await asyncpg.connect(_asyncpg_dsn(self.database_url))
        try:
            return [tuple(await conn.fetchrow(q)) for q in FINGERPRINT]
        finally:
            await conn.close()

    def node(self) -> dict[str, Any]:
        out: dict[str, Any] = ApiClient(f"http://127.0.0.1:{self.port}", self.tenant_key).call(
            "nodes.get", {"tenantId": "acme", "nodeId": "honest"}
        )
        return out


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def live(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Live]:
    workdir = tmp_path_factory.mktemp(f"fuzz-{request.param}")
    if request.param == "sqlite":
        database_url = f"sqlite:///{workdir / 'ledger.db'}"
        dbname = None
    else:
        if not postgres_available():
            if PG_REQUIRED:
                pytest.fail(f"PostgreSQL required but not reachable at {PG_ADMIN_URL}")
            pytest.skip("PostgreSQL not reachable")
        dbname = f"gpufleet_fuzz_{os.getpid()}"
        asyncio.run(_pg_execute(f"DROP DATABASE IF EXISTS {dbname} WITH (FORCE)"))
        asyncio.run(_pg_execute(f"CREATE DATABASE {dbname}"))
        database_url = f"{PG_ADMIN_URL.rsplit('/', 1)[0]}/{dbname}"
    server = EmbeddedNats()
    server.start()
    port = free_port()
    operator_key = new_key()
    logs = open(workdir / "coordinator.log", "ab")
    coordinator = subprocess.Popen(
        [
            str(BIN / "gpufleet-coordinator"),
            "--database-url", database_url,
            "--nats-url", server.url,
            "--port", str(port),
            "--subject-prefix", PREFIX,
            "--insecure-bus",  # the test nats-server has no users
            "--misses", "5",
        ],
        stdout=logs, stderr=subprocess.STDOUT,
        env={**os.environ, "GPUFLEET_BOOTSTRAP_OPERATOR_KEY": operator_key},  # not in argv
    )  # fmt: skip
    agent: subprocess.Popen[bytes] | None = None
    try:
        op = ApiClient(f"http://127.0.0.1:{port}", operator_key, timeout_s=30)
        wait_for(op.healthy, what="coordinator healthy")
        op.call("tenants.create", {"tenantId": "acme"})
        pool_id = op.call("pools.create", {"tenantId": "acme", "name": "p"})["poolId"]
        tenant_key = op.call("apiKeys.create", {"tenantId": "acme"})["key"]
        agent = subprocess.Popen(
            [
                str(BIN / "gpufleet-agent"),
                "--pool-id", pool_id, "--node-id", "honest", "--nats-url", server.url,
                "--subject-prefix", PREFIX, "--simulate", "l40s-pcie-4", "--interval", "0.5",
            ],
            stdout=logs, stderr=subprocess.STDOUT,
        )  # fmt: skip
        live = Live(port, operator_key, tenant_key, pool_id, server.url, database_url)

        def registered() -> bool:
            try:
                return bool(live.node()["state"]["reachable"]["value"])
            except Exception:
                return False

        wait_for(registered, what="the honest agent registered")
        yield live
    finally:
        if agent is not None:
            stop(agent)
        stop(coordinator)
        logs.close()
        server.close()
        if dbname is not None:
            asyncio.run(_pg_execute(f"DROP DATABASE IF EXISTS {dbname} WITH (FORCE)"))


# -- hostile values -------------------------------------------------------------------

EXTREME_NUMBERS = st.sampled_from(
    [0, -1, 2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**30, 1e308, -1e308,
     1e-308, 0.5, 1.0]
)  # fmt: skip
HOSTILE_TEXT = st.one_of(
    st.text(max_size=20),
    st.sampled_from(["\x00", "a\x00b", "\ud800", "x\udfff", "pool_" + "0" * 26 + "\n",
                     "\u202e", "' OR 1=1 --", "../../etc/passwd", "%00", "a" * 5000]),
)  # fmt: skip
SCALARS = st.one_of(st.none(), st.booleans(), EXTREME_NUMBERS, HOSTILE_TEXT)
HOSTILE = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def _fields(method_name: str) -> list[str]:
    method = next(m for m in REGISTRY if m.name == method_name)
    return [f.alias or name for name, f in method.input.model_fields.items()]


COMPUTE = sorted(m.name for m in REGISTRY if m.convention == "compute")


@st.composite
def bodies(draw: st.DrawFn, live: Live) -> tuple[str, bytes]:
    """A method and a raw body: its own field names with plausible or hostile values,
    sometimes extra fields, duplicate keys, deep nesting or broken encoding."""
    name = draw(st.sampled_from(COMPUTE))
    plausible: dict[str, Any] = {
        "tenantId": "acme",
        "poolId": live.pool_id,
        "nodeId": "honest",
        "name": "p",
        "duration": "1h",
        "idempotencyKey": "fuzz-1",
        "devices": [{"class": "gpu", "count": 1}],
        "maintenance": False,
    }
    body: dict[str, Any] = {}
    for field in _fields(name):
        choice = draw(st.integers(0, 3))
        if choice == 0 and field in plausible:
            body[field] = plausible[field]
        elif choice == 1:
            body[field] = draw(HOSTILE)
    if draw(st.booleans()):
        body |= draw(st.dictionaries(st.text(max_size=6), SCALARS, max_size=2))
    text = json.dumps(body, ensure_ascii=draw(st.booleans()))
    shape = draw(st.sampled_from(["plain", "plain", "duplicate", "nested", "bytes"]))
    if shape == "duplicate" and body:
        key = next(iter(body))
        text = text[:-1] + ("," if len(body) else "") + json.dumps(key) + ": null}"
    elif shape == "nested":
        depth = draw(st.integers(30, 20_000))
        text = text[:-1] + (", " if body else "") + '"x": ' + "[" * depth + "]" * depth + "}"
    raw = text.encode("utf-8", "surrogatepass")
    if shape == "bytes":
        raw = raw[: draw(st.integers(0, len(raw)))] + draw(st.binary(max_size=8))
    return name, raw


def test_hostile_inputs_to_every_method_never_500_hang_or_commit(live: Live) -> None:
    keys = [live.operator_key, live.tenant_key]

    @FUZZ
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        name, raw = data.draw(bodies(live))
        module, method = name.split(".", 1)
        before = live.fingerprint()
        status = live.post(f"/api/compute/{module}/{method}", raw, data.draw(st.sampled_from(keys)))
        assert status < 500, (name, raw[:300])
        if status >= 400:
            assert live.fingerprint() == before, (name, status, raw[:300])

    run()


WHENS = [
    "9999-12-31T23:30:00-14:00",
    "0001-01-01T00:00:00+01:00",
    "2035-01-01T00:00:00Z",
    "2035-01-01T00:00:00.0001Z",
]


def test_interval_api_hostile_bodies_never_500_or_commit(live: Live) -> None:
    @FUZZ
    @given(
        body=HOSTILE,
        when=st.sampled_from(WHENS),
        gb=st.one_of(EXTREME_NUMBERS, st.just(16)),
        idem=st.one_of(st.none(), st.just("fz-\u00e9"), st.just("fz-1")),
    )
    def run(body: Any, when: str, gb: Any, idem: str | None) -> None:
        shaped = {"intervals": [{"startsAt": when, "endsAt": when, "capacityGb": gb}], "x": body}
        raw = json.dumps(shaped if isinstance(body, dict) else body).encode(
            "utf-8", "surrogatepass"
        )
        before = live.fingerprint()
        headers = {"Idempotency-Key": idem} if idem is not None else {}
        try:
            status = live.post("/api/capacity/reservations", raw, live.tenant_key, headers)
        except UnicodeEncodeError:
            return  # http.client refuses a non-latin-1 header itself; nothing was sent
        assert status < 500, raw[:300]
        if status >= 400:
            assert live.fingerprint() == before

    run()


def test_the_served_openapi_document_fuzzed_by_schemathesis_never_500(live: Live) -> None:
    base = f"http://127.0.0.1:{live.port}"
    schema = schemathesis.openapi.from_url(f"{base}/api/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    strategy = st.one_of(
        [op.as_strategy(mode) for op in operations for mode in schemathesis.GenerationMode]
    )
    auth = [{"Authorization": f"Bearer {live.operator_key}"}, {"X-API-Key": live.tenant_key}]

    @FUZZ
    @given(case=strategy, headers=st.sampled_from(auth))
    def run(case: schemathesis.Case, headers: dict[str, str]) -> None:
        case.headers = {k: v for k, v in (case.headers or {}).items()
                        if k.lower() not in ("authorization", "x-api-key")} | headers  # fmt: skip
        response = case.call(base_url=base, timeout=ANSWER_TIMEOUT_S)
        assert response.status_code < 500, case.as_curl_command()

    run()


def _valid_for(model: type[Heartbeat] | type[Inventory], raw: bytes) -> bool:
    try:
        model.from_json(raw)
    except (msgspec.DecodeError, ValueError):
        return False
    return True


def test_hostile_bus_payloads_never_disturb_an_honest_node(live: Live) -> None:
    s = Subjects(PREFIX)
    batches: list[list[tuple[str, bytes]]] = []

    @FUZZ
    @given(
        payload=HOSTILE,
        node=st.sampled_from(["honest", "evil", "a" * 128]),
        kind=st.sampled_from(["hb", "inv"]),
        shape=st.sampled_from(["json", "huge", "nested", "duplicate", "bytes"]),
    )
    def collect(payload: Any, node: str, kind: str, shape: str) -> None:
        doc = payload if not isinstance(payload, dict) else {"nodeId": node} | payload
        raw = json.dumps(doc).encode("utf-8", "surrogatepass")
        if shape == "huge":
            raw = b'{"nodeId": "' + b"x" * 2_000_000 + b'"}'
        elif shape == "nested":
            raw = b"[" * 100_000 + b"]" * 100_000
        elif shape == "duplicate":
            raw = b'{"nodeId": "honest", "nodeId": "evil", "seq": 1e999}'
        elif shape == "bytes":
            raw = raw[: len(raw) // 2] + b"\xff\x00"
        subject = (s.heartbeat if kind == "hb" else s.inventory)(live.pool_id, node)
        model = Heartbeat if kind == "hb" else Inventory
        if node == "honest" and _valid_for(model, raw):
            return  # a valid message on its own subject is the node speaking, not poison
        batches.append([(subject, raw)])

    collect()

    async def send() -> None:
        nc = await nats.connect(live.nats_url, max_reconnect_attempts=1)
        try:
            for batch in batches:
                for subject, raw in batch:
                    if len(raw) < 1024 * 1024:
                        await nc.publish(subject, raw)
            await nc.flush()
        finally:
            await nc.close()

    asyncio.run(send())
    time.sleep(2.0)  # four of the honest node's intervals
    node = live.node()
    assert node["state"]["reachable"]["value"] is True
    assert node["state"]["health"]["value"] == "healthy"
    status = live.post("/api/compute/capacity/summary", b'{"tenantId": "acme"}', live.tenant_key)
    assert status == 200
