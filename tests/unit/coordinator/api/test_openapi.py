"""The OpenAPI document describes every answer: each operation's 200 schema (its output
model) and its failures, every property described, and every example valid."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from coordinator.api.http.openapi import build_openapi
from coordinator.api.methods import REGISTRY
from ops.cli import api_spec
from tests.openapi_check import operation, response_schema, validate

DOC = build_openapi(REGISTRY, api_spec.API_VERSION)
SCHEMAS = DOC["components"]["schemas"]


def _operations() -> list[tuple[str, str, dict[str, Any]]]:
    return [(path, verb, op) for path, verbs in DOC["paths"].items() for verb, op in verbs.items()]


def test_every_method_declares_an_output_model_and_a_200_schema() -> None:
    assert {op["operationId"] for _, _, op in _operations()} == {m.name for m in REGISTRY}
    for method in REGISTRY:
        if method.streams is not None:  # an export: its media type, streamed
            assert method.output is None, method.name
            assert response_schema(DOC, method.name, 200)[0] == method.streams
            continue
        assert method.output is not None, method.name
        media, schema = response_schema(DOC, method.name, 200)
        assert media == "application/json" and schema["$ref"].endswith(method.output.__name__)


def test_compute_failures_are_the_envelope_and_the_seeds_are_its_own_words() -> None:
    envelope = {"$ref": "#/components/schemas/ErrorEnvelope"}
    for method in REGISTRY:
        if method.convention == "compute":
            statuses = [400, 401, 403, 404, 413, 503] + ([409] if method.kind == "write" else [])
            for status in statuses:
                assert response_schema(DOC, method.name, status) == (
                    "application/json",
                    envelope,
                ), (method.name, status)
            continue
        assert response_schema(DOC, method.name, 400) == ("text/plain", {"type": "string"})
        for status in (401, 403, 503):
            assert response_schema(DOC, method.name, status)[1] == envelope
    media, conflict = response_schema(DOC, "intervals.reserve", 409)
    assert media == "application/json"
    assert [s["$ref"].rsplit("/", 1)[1] for s in conflict["oneOf"]] == [
        "CapacityNotAvailableBody",
        "IdempotencyConflictBody",
    ]
    validate(DOC, conflict, {"error": "idempotency_key_conflict", "message": "other body"})
    with pytest.raises(jsonschema.ValidationError):
        validate(DOC, conflict, {"error": {"code": "IDEMPOTENCY_KEY_CONFLICT"}})


def _properties(schema: Any, where: str) -> list[tuple[str, dict[str, Any]]]:
    found: list[tuple[str, dict[str, Any]]] = []
    if isinstance(schema, dict):
        for name, prop in schema.get("properties", {}).items():
            found.append((f"{where}.{name}", prop))
        for key, sub in schema.items():
            if key != "properties":
                found += _properties(sub, where)
    elif isinstance(schema, list):
        for sub in schema:
            found += _properties(sub, where)
    return found


def test_every_schema_property_and_parameter_has_a_description() -> None:
    missing = [
        where
        for name, schema in SCHEMAS.items()
        for where, prop in _properties(schema, name)
        if not prop.get("description")
    ]
    assert not missing, missing
    for _, _, op in _operations():
        for param in op.get("parameters", []):
            assert param.get("description"), (op["operationId"], param["name"])


def test_input_constraints_survive_in_the_document() -> None:
    create = SCHEMAS["ReservationCreateInput"]["properties"]
    assert create["poolId"]["pattern"] == r"^pool_[0-9a-hjkmnp-tv-z]{26,52}$"
    assert create["devices"]["maxItems"] == 8 and create["devices"]["minItems"] == 1
    assert create["leaseSeconds"]["anyOf"][0] == {"maximum": 86400, "minimum": 30,
                                                   "type": "integer"}  # fmt: skip
    assert SCHEMAS["ReservationCreateInput"]["additionalProperties"] is False
    assert SCHEMAS["DeviceInput"]["properties"]["count"]["maximum"] == 64


def test_every_example_is_valid_against_its_schema() -> None:
    checked = 0
    for _, _, op in _operations():
        contents = [op.get("requestBody", {}).get("content", {})]
        for response in op["responses"].values():
            ref = response.get("$ref")
            if ref:
                response = DOC["components"]["responses"][ref.rsplit("/", 1)[1]]
            contents.append(response.get("content", {}))
        for content in contents:
            for media, body in content.items():
                assert "example" in body, (op["operationId"], media)
                if media == "application/json":
                    validate(DOC, body["schema"], body["example"])
                    checked += 1
    assert checked > 3 * len(list(REGISTRY))


def test_output_models_forbid_undeclared_fields() -> None:
    # A closed schema is what makes "real answers validate" mean "every field declared".
    reservation = operation(DOC, "reservations.get")["responses"]["200"]["content"]
    example = reservation["application/json"]["example"]
    validate(DOC, reservation["application/json"]["schema"], example)
    with pytest.raises(jsonschema.ValidationError):
        validate(DOC, reservation["application/json"]["schema"], example | {"surprise": 1})
