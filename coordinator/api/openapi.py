"""The OpenAPI 3.1 document, generated from the method registry (both conventions)."""

from __future__ import annotations

from typing import Any

from pydantic.json_schema import models_json_schema

from coordinator.api.registry import Method, Registry, RestInput, where

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message", "details"],
            "properties": {
                "code": {"type": "string"},
                "message": {"type": "string"},
                "details": {},
            },
        }
    },
}


def _seed_operation(m: Method) -> dict[str, Any]:
    """A `seed-002` method: parameters from its input's fields, plain-text 400s."""
    assert issubclass(m.input, RestInput)
    operation: dict[str, Any] = {
        "operationId": m.name,
        "summary": m.summary,
        "tags": [m.module],
        "x-gpufleet": {"kind": m.kind, "permission": m.permission, "scope": m.scope,
                       "phase": m.phase, "status": m.status, "seed": "002"},
        "parameters": [],
        "responses": {
            "200": {"description": "OK", "content": {"application/json": {}}},
            "400": {"description": "Invalid request", "content": {"text/plain": {}}},
            "409": {"description": "Conflict", "content": {"application/json": {}}},
        },
        "security": [{"bearer": []}, {"apiKey": []}],
    }  # fmt: skip
    for field in m.input.model_fields.values():
        source = where(field)
        if source == "body":
            operation["requestBody"] = {"required": True, "content": {"application/json": {}}}
            continue
        extra = field.json_schema_extra
        assert isinstance(extra, dict)
        operation["parameters"].append(
            {
                "name": field.alias,
                "in": source,
                "required": bool(extra.get("required")),
                "schema": {"type": "string"},
            }
        )
    return operation


def _compute_operation(m: Method, schema: Any) -> dict[str, Any]:
    return {
        "operationId": m.name,
        "summary": m.summary,
        "tags": [m.module],
        "x-gpufleet": {
            "kind": m.kind,
            "permission": m.permission,
            "scope": m.scope,
            "phase": m.phase,
            "status": m.status,
        },
        "requestBody": {"required": True, "content": {"application/json": {"schema": schema}}},
        "responses": {
            "200": {"description": "OK", "content": {"application/json": {}}},
            "default": {
                "description": "Error",
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
            },
        },
        "security": [{"bearer": []}, {"apiKey": []}],
    }


def build_openapi(registry: Registry, version: str) -> dict[str, Any]:
    compute = [m for m in registry if m.convention == "compute"]
    keyed, defs = models_json_schema(
        [(m.input, "validation") for m in compute],
        by_alias=True,
        ref_template="#/components/schemas/{model}",
    )
    paths: dict[str, Any] = {}
    for m in registry:
        operation = (
            _compute_operation(m, keyed[(m.input, "validation")])
            if m.convention == "compute"
            else _seed_operation(m)
        )
        paths.setdefault(m.path, {})[m.verb.lower()] = operation
    schemas = dict(defs.get("$defs", {}))
    schemas["Error"] = ERROR_SCHEMA
    return {
        "openapi": "3.1.0",
        "info": {"title": "gpufleet coordinator", "version": version},
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
            },
        },
    }
