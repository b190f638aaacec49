"""The OpenAPI 3.1 document, generated from the method registry."""

from __future__ import annotations

from typing import Any

from pydantic.json_schema import models_json_schema

from coordinator.api.intervals import ROUTES
from coordinator.api.registry import Registry


def _query(name: str, required: bool = False) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": required, "schema": {"type": "string"}}


_INTERVAL_PARAMS: dict[tuple[str, str], list[dict[str, Any]]] = {
    ("POST", "/api/capacity/reservations"): [
        {"name": "Idempotency-Key", "in": "header", "schema": {"type": "string"}},
        _query("poolId"),
    ],
    ("GET", "/api/capacity/reservations"): [
        _query("from", True),
        _query("to", True),
        _query("cursor"),
        _query("limit"),
    ],
    ("GET", "/api/capacity/calendar"): [_query("from", True), _query("to", True), _query("poolId")],
}

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


def build_openapi(registry: Registry, version: str) -> dict[str, Any]:
    methods = list(registry)
    keyed, defs = models_json_schema(
        [(m.input, "validation") for m in methods],
        by_alias=True,
        ref_template="#/components/schemas/{model}",
    )
    paths: dict[str, Any] = {}
    for m in methods:
        paths[m.path] = {
            "post": {
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
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": keyed[(m.input, "validation")]}},
                },
                "responses": {
                    "200": {"description": "OK", "content": {"application/json": {}}},
                    "default": {
                        "description": "Error",
                        "content": {
                            "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}
                        },
                    },
                },
                "security": [{"bearer": []}, {"apiKey": []}],
            }
        }
    for verb, path, handler, permission in ROUTES:
        paths.setdefault(path, {})[verb.lower()] = {
            "operationId": f"{verb.lower()} {path}",
            "summary": (handler.__doc__ or "").strip().split("\n")[0],
            "tags": ["intervals"],
            "x-gpufleet": {"permission": permission, "seed": "002"},
            "parameters": _INTERVAL_PARAMS.get((verb, path), []),
            "responses": {
                "200": {"description": "OK", "content": {"application/json": {}}},
                "400": {"description": "Invalid request", "content": {"text/plain": {}}},
                "409": {"description": "Conflict", "content": {"application/json": {}}},
            },
            "security": [{"bearer": []}, {"apiKey": []}],
        }
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
