"""The API's methods as the CLI sees them: read from `ops/cli/openapi.json`, the coordinator's
OpenAPI document generated from its method registry and committed with the package.

The CLI runs where only the base install is (no aiohttp, no SQLAlchemy), so it cannot
import the registry; the committed document stands in for it, and a unit test fails
when it and the registry disagree (`scripts/openapi` rewrites it). Each compute
method's input schema becomes a list of `Param`s, one flag each: scalars typed, enums
as choices, lists of scalars as a repeated flag, objects and lists of objects as
`k=v,k=v` (typed from the nested schema) or JSON.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, Literal

SPEC_FILE = "openapi.json"
API_VERSION = "0.1.0"

Kind = Literal["str", "int", "float", "bool", "choice", "list", "object", "objects", "any"]


@dataclass(frozen=True, slots=True)
class Param:
    name: str  # the API's (camelCase) name
    kind: Kind
    required: bool
    choices: tuple[str, ...] = ()
    item: Kind = "str"  # a list's items
    nested: tuple[Param, ...] = ()  # an object's (or list of objects') fields
    default: Any = None

    @property
    def flag(self) -> str:
        """`poolId` → `--pool-id`, `from` → `--from`, `memoryGiB` → `--memory-gib`."""
        words = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "-", self.name)
        return "--" + words.lower()

    def describe(self) -> str:
        if self.kind == "choice":
            what = "|".join(self.choices)
        elif self.kind == "list":
            what = ("|".join(self.choices) if self.choices else self.item) + ", repeatable"
        elif self.kind in ("object", "objects"):
            keys = ",".join(f"{p.name}=…" for p in self.nested) or "JSON"
            what = keys + (" (repeatable)" if self.kind == "objects" else "") + " or JSON"
        else:
            what = self.kind
        tail = " [required]" if self.required else ""
        if not self.required and self.default not in (None, [], {}, False):
            tail = f" [default {self.default}]"
        return what + tail


@dataclass(frozen=True, slots=True)
class MethodSpec:
    name: str
    summary: str
    kind: str  # read | write
    permission: str
    scope: str
    params: tuple[Param, ...]

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)


def _deref(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if isinstance(ref, str):
        return dict(defs[ref.rsplit("/", 1)[1]])
    return schema


def _unnull(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    options = [s for s in schema.get("anyOf", [schema]) if s.get("type") != "null"]
    chosen = options[0] if len(options) == 1 else schema
    return _deref(chosen, defs)


def _kind(schema: dict[str, Any], defs: dict[str, Any]) -> tuple[Kind, dict[str, Any]]:
    s = _unnull(schema, defs)
    if "enum" in s:
        return "choice", s
    t = s.get("type")
    if t == "string":
        return "str", s
    if t == "integer":
        return "int", s
    if t == "number":
        return "float", s
    if t == "boolean":
        return "bool", s
    if t == "array":
        item_kind, item = _kind(s.get("items", {}), defs)
        if item_kind == "object" and "properties" in item:
            return "objects", s
        return ("list", s) if item_kind in ("str", "int", "float", "choice") else ("any", s)
    if t == "object" and "properties" in s:
        return "object", s
    return "any", s


def _params(schema: dict[str, Any], defs: dict[str, Any]) -> tuple[Param, ...]:
    required = set(schema.get("required", []))
    out: list[Param] = []
    for name, prop in schema.get("properties", {}).items():
        kind, resolved = _kind(prop, defs)
        choices: tuple[str, ...] = tuple(str(c) for c in resolved.get("enum", ()))
        item: Kind = "str"
        nested: tuple[Param, ...] = ()
        if kind == "list":
            item, item_schema = _kind(resolved.get("items", {}), defs)
            choices = tuple(str(c) for c in item_schema.get("enum", ()))
        elif kind == "object":
            nested = _params(resolved, defs)
        elif kind == "objects":
            nested = _params(_deref(resolved["items"], defs), defs)
        out.append(Param(name, kind, name in required, choices, item, nested, prop.get("default")))
    return tuple(out)


def methods_from(document: dict[str, Any]) -> dict[str, MethodSpec]:
    """Compute methods (the seed's REST endpoints are reachable with `curl`, not here)."""
    defs = document.get("components", {}).get("schemas", {})
    out: dict[str, MethodSpec] = {}
    for path, verbs in document.get("paths", {}).items():
        if not path.startswith("/api/compute/"):
            continue
        op = verbs["post"]
        meta = op.get("x-gpufleet", {})
        schema = _deref(op["requestBody"]["content"]["application/json"]["schema"], defs)
        out[op["operationId"]] = MethodSpec(
            op["operationId"],
            op.get("summary", ""),
            meta.get("kind", "read"),
            meta.get("permission", ""),
            meta.get("scope", ""),
            _params(schema, defs),
        )
    return dict(sorted(out.items()))


@cache
def methods() -> dict[str, MethodSpec]:
    text = resources.files("ops.cli").joinpath(SPEC_FILE).read_text()
    return methods_from(json.loads(text))


def render_document(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=1) + "\n"
