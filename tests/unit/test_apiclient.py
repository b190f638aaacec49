"""The typed client is generated from the registry's OpenAPI document and is typed all
the way down: the committed module is what the generator makes now, every method is
there (sync and async), and mypy --strict sees real types, not `Any`, in its answers."""

from __future__ import annotations

import inspect
import textwrap
from pathlib import Path

from mypy import api as mypy_api

from coordinator.api.methods import REGISTRY
from ops import apiclient_gen
from ops.api_spec import generated_document
from ops.apiclient import AsyncClient, Client
from ops.apiclient.transport import error_from

ROOT = Path(__file__).resolve().parents[2]


def test_committed_client_is_what_the_generator_makes_from_the_registry() -> None:
    want = apiclient_gen.render_client(generated_document())
    assert apiclient_gen.TARGET.read_text() == want, "run: python -m ops.apiclient_gen"


def test_every_method_is_a_typed_method_on_both_clients() -> None:
    for cls in (Client, AsyncClient):
        client = cls("http://127.0.0.1:1", "k")
        for method in REGISTRY:
            group = getattr(client, apiclient_gen.snake(method.module))
            fn = getattr(group, apiclient_gen.snake(method.method))
            answer = inspect.signature(fn).return_annotation
            assert answer == method.output.__name__, (cls.__name__, method.name, answer)
            assert inspect.iscoroutinefunction(fn) == (cls is AsyncClient)
    client = Client("http://127.0.0.1:1", "k")
    paged = {m.module for m in REGISTRY if hasattr(getattr(client, m.module, None), "list_iter")}
    assert paged == {"reservations", "nodes", "intervals"}


USAGE = """
from ops.apiclient import AsyncClient, Client


def use(c: Client, pool: str) -> int:
    res = c.reservations.get({"tenantId": "acme", "reservationId": "rsv_x"})
    start: int = res["start"]
    state: str = res["state"]
    atom: str = res["atoms"][0]["class"]
    for r in c.reservations.list_iter({"tenantId": "acme", "limit": 10}):
        end: int = r["end"]
    rows = c.capacity.by_pool({"tenantId": "acme", "poolId": pool})["rows"]
    free: int = rows[0]["available"]
    cal = c.intervals.calendar("2030-01-01T00:00:00Z", "2030-01-01T01:00:00Z", pool_id=pool)
    gb: int = cal["intervals"][0]["reservableGb"]
    me: bool = c.api_keys.self_()["operator"]
    return start + end + free + gb + len(state) + len(atom) + int(me)


async def ause(c: AsyncClient, pool: str) -> str:
    p = await c.pools.get({"tenantId": "acme", "poolId": pool})
    name: str = p["name"]
    async for node in c.nodes.list_iter({"poolId": pool}):
        host: str = node["hostname"]
        bucket: str = (await c.nodes.get({"nodeId": node["nodeId"]}))["atoms"][0]["bucket"]
    return name + host + bucket
"""

MISUSE = """
from ops.apiclient import Client


def misuse(c: Client) -> None:
    res = c.reservations.get({"tenantId": "acme", "reservationId": "rsv_x"})
    wrong: str = res["start"]
    res["nope"]
    c.reservations.create({"tenantId": "acme"})
"""


def _mypy(tmp_path: Path, source: str) -> tuple[str, int]:
    path = tmp_path / "usage.py"
    path.write_text(textwrap.dedent(source))
    config = tmp_path / "mypy.ini"
    config.write_text("[mypy]\n")
    out, err, status = mypy_api.run(
        [
            "--strict",
            "--config-file",
            str(config),
            "--cache-dir",
            str(ROOT / ".mypy_cache"),
            "--no-error-summary",
            str(path),
        ]
    )
    return out + err, status


def test_mypy_strict_sees_the_answer_types_not_any(tmp_path: Path) -> None:
    out, status = _mypy(tmp_path, USAGE)
    assert status == 0, out
    out, status = _mypy(tmp_path, MISUSE)
    assert status == 1
    assert 'expression has type "int", variable has type "str"' in out, out
    assert '"ReservationOut" has no key "nope"' in out, out
    assert "Missing keys" in out and "ReservationCreateInput" in out, out


def test_interval_api_failures_become_typed_errors() -> None:
    text = error_from(400, "text/plain", b"intervals[0].capacityGb: must be a multiple\n", "u")
    assert (text.status, text.code, text.message) == (
        400,
        "INVALID_REQUEST",
        "intervals[0].capacityGb: must be a multiple",
    )
    body = b'{"error": "capacity_not_available", "intervals": [{"startsAt": "x"}]}'
    refused = error_from(409, "application/json", body, "u")
    assert refused.code == "capacity_not_available"
    assert refused.details == {"intervals": [{"startsAt": "x"}]}
    envelope = b'{"error": {"code": "NOT_FOUND", "message": "gone", "details": {}}}'
    assert error_from(404, "application/json", envelope, "u").code == "NOT_FOUND"
