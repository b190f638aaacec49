"""The OpenAPI 3.1 document, generated from the method registry (both conventions).

Every operation says what it answers: its output model for 200 and, per failure, the
body that comes with it: the error envelope for compute methods; for the seed's interval
endpoints a plain-text 400/404 and the seed's own 409 bodies (authentication, size and
availability failures are enveloped there too, as the server answers them before the
seed's words apply). Schemas come from the pydantic models, field descriptions
included; examples are built from the schemas (field examples, defaults, bounds).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from coordinator.api.http.registry import Method, Registry
from coordinator.api.shapes.base import RestInput, where
from coordinator.api.shapes.outputs import ErrorEnvelope

REF = "#/components/schemas/{model}"

# status → (components/responses name, description, an example error code)
ERRORS: dict[str, tuple[str, str, str]] = {
    "400": ("InvalidInput", "Invalid input: `details.fields` names each failing field.",
            "INVALID_INPUT"),
    "401": ("Unauthenticated", "No API key, or an invalid or revoked one.", "UNAUTHENTICATED"),
    "403": ("PermissionDenied", "The key lacks the permission, or may not act for the tenant.",
            "PERMISSION_DENIED"),
    "404": ("NotFound", "Not found, or not visible to this tenant.", "NOT_FOUND"),
    "409": ("Conflict", "Refused: CAPACITY_NOT_AVAILABLE, QUOTA_EXCEEDED, "
            "IDEMPOTENCY_KEY_CONFLICT or ALREADY_EXISTS.", "CAPACITY_NOT_AVAILABLE"),
    "413": ("PayloadTooLarge", "The request body is over 1 MiB.", "PAYLOAD_TOO_LARGE"),
    "503": ("Unavailable", "Not answering now (not the leader, shutting down): retry later.",
            "UNAVAILABLE"),
    "default": ("Internal", "An unexpected failure (INTERNAL).", "INTERNAL"),
}  # fmt: skip
SECURITY: list[dict[str, list[str]]] = [{"bearer": []}, {"apiKey": []}]


def example(schema: dict[str, Any], defs: dict[str, Any], *, full: bool) -> Any:
    """A value that validates against `schema`: field examples first, then defaults,
    enum members and bounds. `full`: every property (an answer); else the required ones
    and those with an example (a request to try)."""
    if "examples" in schema:
        return schema["examples"][0]
    if "$ref" in schema:
        return example(defs[schema["$ref"].rsplit("/", 1)[1]], defs, full=full)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][0]
    options = schema.get("anyOf") or schema.get("oneOf")
    if options:
        real = [o for o in options if o.get("type") != "null"]
        return example(real[0], defs, full=full) if real else None
    if "default" in schema and schema["default"] not in (None, [], {}):
        return schema["default"]
    kind = schema.get("type")
    if kind == "object":
        required = set(schema.get("required", []))
        return {
            name: example(prop, defs, full=full)
            for name, prop in schema.get("properties", {}).items()
            if full or name in required or "examples" in prop
        }
    if kind == "array":
        return [example(schema.get("items", {}), defs, full=full)] * max(
            1, schema.get("minItems", 1)
        )
    if kind == "string":
        text = "string".ljust(schema.get("minLength", 0), "x")
        return text[: schema.get("maxLength", len(text))]
    if kind in ("integer", "number"):
        return schema.get("minimum", 0)
    if kind == "boolean":
        return False
    return None


def _json(model: type[BaseModel], defs: dict[str, Any], *, full: bool) -> dict[str, Any]:
    schema = {"$ref": REF.format(model=model.__name__)}
    return {"schema": schema, "example": example(schema, defs, full=full)}


def _ok(m: Method, defs: dict[str, Any]) -> dict[str, Any]:
    if m.streams is not None:
        return {
            "description": "Streamed as it is made.",
            "content": {m.streams: {"schema": {"type": "string"}, "example": ""}},
        }
    assert m.output is not None, f"method {m.name} declares no output model"
    description = (m.output.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
    return {
        "description": description or "OK",
        "content": {"application/json": _json(m.output, defs, full=True)},
    }


def _enveloped(status: str) -> dict[str, Any]:
    return {"$ref": f"#/components/responses/{ERRORS[status][0]}"}


def _text(description: str, sample: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"text/plain": {"schema": {"type": "string"}, "example": sample}},
    }


def _meta(m: Method) -> dict[str, Any]:
    meta = {"kind": m.kind, "permission": m.permission, "scope": m.scope,
            "phase": m.phase, "status": m.status}  # fmt: skip
    return meta | ({"seed": "002"} if m.convention == "seed-002" else {})


def _seed_operation(m: Method, defs: dict[str, Any]) -> dict[str, Any]:
    """A `seed-002` method: parameters from its input's fields, the seed's answers."""
    assert issubclass(m.input, RestInput)
    responses: dict[str, Any] = {
        "200": _ok(m, defs),
        "400": _text("The request broke one of the seed's rules: each, one per line.",
                     "intervals[0].capacityGb: must be a positive multiple of 4\n"),
        "401": _enveloped("401"),
        "403": _enveloped("403"),
    }  # fmt: skip
    operation: dict[str, Any] = {
        "operationId": m.name,
        "summary": m.summary,
        "tags": [m.module],
        "x-gpufleet": _meta(m),
        "parameters": [],
        "responses": responses,
        "security": SECURITY,
    }
    for field in m.input.model_fields.values():
        source = where(field)
        if source == "body":
            assert m.body is not None, f"method {m.name} reads a body but declares no model"
            content = _json(m.body, defs, full=False)
            operation["requestBody"] = {"required": True, "content": {"application/json": content}}
            continue
        extra = field.json_schema_extra
        assert isinstance(extra, dict)
        operation["parameters"].append(
            {
                "name": field.alias,
                "in": source,
                "required": bool(extra.get("required")),
                "description": field.description or "",
                "schema": extra.get("schema", {"type": "string"}),
            }
        )
    if "poolId" in {p["name"] for p in operation["parameters"]}:
        responses["404"] = _text("The pool named is not visible to this tenant.",
                                 "pool pool_01hzy3k4m5n6p7q8r9s0t1v2w3 not found\n")  # fmt: skip
    if m.conflicts:
        refs = [{"$ref": REF.format(model=c.__name__)} for c in m.conflicts]
        schema: dict[str, Any] = refs[0] if len(refs) == 1 else {"oneOf": refs}
        responses["409"] = {
            "description": " ".join(
                (c.__doc__ or "").strip().replace("\n", " ") for c in m.conflicts
            ),
            "content": {"application/json": {"schema": schema,
                                             "example": example(refs[0], defs, full=True)}},
        }  # fmt: skip
    if m.verb == "POST":
        responses["413"] = _enveloped("413")
    responses["503"] = _enveloped("503")
    return operation


def _compute_operation(m: Method, schema: Any, defs: dict[str, Any]) -> dict[str, Any]:
    statuses = ["400", "401", "403", "404"] + (["409"] if m.kind == "write" else [])
    responses = {"200": _ok(m, defs)} | {
        s: _enveloped(s) for s in [*statuses, "413", "503", "default"]
    }
    return {
        "operationId": m.name,
        "summary": m.summary,
        "tags": [m.module],
        "x-gpufleet": _meta(m),
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": schema, "example": example(schema, defs, full=False)}
            },
        },
        "responses": responses,
        "security": SECURITY,
    }


def _error_responses(defs: dict[str, Any]) -> dict[str, Any]:
    ref = {"$ref": REF.format(model=ErrorEnvelope.__name__)}
    return {
        name: {
            "description": description,
            "content": {
                "application/json": {
                    "schema": ref,
                    "example": {"error": {"code": code, "message": description, "details": {}}},
                }
            },
        }
        for name, description, code in ERRORS.values()
    }


def build_openapi(registry: Registry, version: str) -> dict[str, Any]:
    compute = [m for m in registry if m.convention == "compute"]
    wanted: list[tuple[type[BaseModel], JsonSchemaMode]] = [
        (m.input, "validation") for m in compute
    ]
    for m in registry:
        wanted += [(model, "serialization") for model in (m.output, m.body, *m.conflicts) if model]
    wanted.append((ErrorEnvelope, "serialization"))
    keyed, top = models_json_schema(list(dict.fromkeys(wanted)), by_alias=True, ref_template=REF)
    defs: dict[str, Any] = dict(top.get("$defs", {}))
    paths: dict[str, Any] = {}
    for m in registry:
        operation = (
            _compute_operation(m, keyed[(m.input, "validation")], defs)
            if m.convention == "compute"
            else _seed_operation(m, defs)
        )
        paths.setdefault(m.path, {})[m.verb.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {"title": "gpufleet coordinator", "version": version},
        "paths": paths,
        "components": {
            "schemas": defs,
            "responses": _error_responses(defs),
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
            },
        },
    }
