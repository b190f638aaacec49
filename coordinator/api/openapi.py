"""The OpenAPI 3.1 document, generated from the method registry."""

from __future__ import annotations

from typing import Any

from pydantic.json_schema import models_json_schema

from coordinator.api.registry import Registry

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
