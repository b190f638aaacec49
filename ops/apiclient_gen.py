"""Generates the typed client's module (`ops/apiclient/generated.py`) from the OpenAPI
document the registry makes (`ops.api_spec.generated_document`): a TypedDict per schema
(inputs and outputs), and per API module a sync and an async class with one typed method
per API method, plus a `<method>_iter` page iterator for methods answering `nextCursor`.

`python -m ops.apiclient_gen` rewrites the committed module; a unit test fails when it
and the registry disagree (as for `ops/openapi.json`).
"""

from __future__ import annotations

import keyword
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ops.api_spec import generated_document

TARGET = Path(__file__).with_name("apiclient") / "generated.py"
HEADER = '''"""Typed API client methods and TypedDicts, generated from the OpenAPI document.

Do not edit: run `python -m ops.apiclient_gen` (a test checks this file is current).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any, Literal, NotRequired, TypedDict, cast

from ops.apiclient.transport import AsyncTransport, SyncTransport

'''


def snake(name: str) -> str:
    """`setMaintenance` → `set_maintenance`; keywords and `self` get a trailing `_`."""
    out = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).replace("-", "_").lower()
    return out + "_" if keyword.iskeyword(out) or out == "self" else out


def pascal(name: str) -> str:
    return name[:1].upper() + name[1:]


def _ref_name(schema: dict[str, Any]) -> str:
    return str(schema["$ref"]).rsplit("/", 1)[1]


def py_type(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        return _ref_name(schema)
    if "const" in schema:
        return f"Literal[{schema['const']!r}]"
    if "enum" in schema:
        return "Literal[" + ", ".join(repr(v) for v in schema["enum"]) + "]"
    options = schema.get("anyOf") or schema.get("oneOf")
    if options:
        return " | ".join(dict.fromkeys(py_type(o) for o in options))
    kind = schema.get("type")
    simple = {"string": "str", "integer": "int", "number": "float", "boolean": "bool",
              "null": "None"}  # fmt: skip
    if kind in simple:
        return simple[kind]
    if kind == "array":
        return f"list[{py_type(schema.get('items', {}))}]"
    if kind == "object":
        extra = schema.get("additionalProperties")
        return f"dict[str, {py_type(extra) if isinstance(extra, dict) else 'Any'}]"
    return "Any"


def _refs(schema: Any) -> set[str]:
    if isinstance(schema, dict):
        found = {_ref_name(schema)} if "$ref" in schema else set()
        return found.union(*(_refs(v) for v in schema.values()))
    if isinstance(schema, list):
        return set().union(*(_refs(v) for v in schema))
    return set()


def _ordered(schemas: dict[str, Any]) -> list[str]:
    """Schemas after those they name (the TypedDicts are evaluated at import)."""
    done: list[str] = []

    def visit(name: str) -> None:
        if name in done:
            return
        for dep in sorted(_refs(schemas[name]) - {name}):
            visit(dep)
        done.append(name)

    for name in sorted(schemas):
        visit(name)
    return done


def typed_dict(name: str, schema: dict[str, Any]) -> str:
    required = set(schema.get("required", []))
    lines = [f"# {line}" for line in (schema.get("description") or "").splitlines() if line]
    lines.append(f'{name} = TypedDict("{name}", {{')
    for prop, sub in schema.get("properties", {}).items():
        t = py_type(sub)
        lines.append(f"    {prop!r}: {t if prop in required else f'NotRequired[{t}]'},")
    lines.append("})")
    return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class Op:
    name: str
    verb: str
    path: str
    op: dict[str, Any]

    @property
    def module(self) -> str:
        return self.name.split(".", 1)[0]

    @property
    def method(self) -> str:
        return snake(self.name.split(".", 1)[1])

    @property
    def output(self) -> str:
        return _ref_name(self.op["responses"]["200"]["content"]["application/json"]["schema"])

    @property
    def compute(self) -> bool:
        return self.path.startswith("/api/compute/")


def _doc(op: Op) -> str:
    text = " ".join((op.op.get("summary") or op.name).split()).replace('"""', "'''")
    return f'        """{text}"""'


def _paged(op: Op, schemas: dict[str, Any]) -> tuple[str, str] | None:
    """(items key, item type) for a method answering pages with `nextCursor`."""
    out = schemas[op.output].get("properties", {})
    if "nextCursor" not in out:
        return None
    lists = [(k, v) for k, v in out.items() if v.get("type") == "array"]
    assert len(lists) == 1, f"{op.name}: a page has one list"
    key, prop = lists[0]
    return key, py_type(prop["items"])


def _compute_methods(op: Op, schemas: dict[str, Any], aio: bool) -> list[str]:
    schema = op.op["requestBody"]["content"]["application/json"]["schema"]
    body = _ref_name(schema)
    optional = not schemas[body].get("required")
    arg = f"body: {body} | None = None" if optional else f"body: {body}"
    sent = "body or {}" if optional else "body"
    d, aw = ("async def", "await ") if aio else ("def", "")
    lines = [
        f"    {d} {op.method}(self, {arg}) -> {op.output}:",
        _doc(op),
        f'        return cast("{op.output}", {aw}self._t.call("{op.name}", {sent}))',
    ]
    paged = _paged(op, schemas)
    if paged:
        key, item = paged
        it = "AsyncIterator" if aio else "Iterator"
        lines += [
            "",
            f"    {d} {op.method}_iter(self, body: {body} | None = None) -> {it}[{item}]:",
            f'        """Every item `{op.name}` answers, page after page (`nextCursor`)."""',
            "        ask: dict[str, Any] = dict(body or {})",
            "        while True:",
            f'            page = {aw}self.{op.method}(cast("{body}", ask))',
            f'            for item in page["{key}"]:',
            "                yield item",
            '            if page["nextCursor"] is None:',
            "                return",
            '            ask["cursor"] = page["nextCursor"]',
        ]
    return lines


def _seed_methods(op: Op, schemas: dict[str, Any], aio: bool) -> list[str]:
    params = op.op.get("parameters", [])
    args: list[str] = []
    kwargs: list[str] = []
    where: dict[str, list[str]] = {"query": [], "header": []}
    for p in params:
        name = snake(p["name"])
        t = py_type(p["schema"])
        (args if p["required"] else kwargs).append(
            f"{name}: {t}" if p["required"] else f"{name}: {t} | None = None"
        )
        where[p["in"]].append(f'"{p["name"]}": {name}')
    body = op.op.get("requestBody")
    if body:
        args.insert(0, f"body: {_ref_name(body['content']['application/json']['schema'])}")
    signature = ", ".join(["self", *args, *(["*", *kwargs] if kwargs else [])])
    call = [f'"{op.verb}"', f'"{op.path}"']
    for keyword_, names in (("query", where["query"]), ("headers", where["header"])):
        if names:
            call.append(f"{keyword_}={{{', '.join(names)}}}")
    if body:
        call.append("body=body")
    d, aw = ("async def", "await ") if aio else ("def", "")
    lines = [
        f"    {d} {op.method}({signature}) -> {op.output}:",
        _doc(op),
        f'        return cast("{op.output}", {aw}self._t.request({", ".join(call)}))',
    ]
    paged = _paged(op, schemas)
    if paged:
        key, item = paged
        it = "AsyncIterator" if aio else "Iterator"
        passed = [a.split(":")[0] for a in args] + [
            k.split(":")[0] for k in kwargs if not k.startswith("cursor")
        ]
        outer = ", ".join(["self", *args, *(["*"] if kwargs else []),
                           *[k for k in kwargs if not k.startswith("cursor")]])  # fmt: skip
        forward = ", ".join(f"{n}={n}" for n in passed)
        lines += [
            "",
            f"    {d} {op.method}_iter({outer}) -> {it}[{item}]:",
            f'        """Every item `{op.name}` answers, page after page (`nextCursor`)."""',
            "        cursor: str | None = None",
            "        while True:",
            f"            page = {aw}self.{op.method}({forward}, cursor=cursor)",
            f'            for item in page["{key}"]:',
            "                yield item",
            '            cursor = page["nextCursor"]',
            "            if cursor is None:",
            "                return",
        ]
    return lines


def _operations(document: dict[str, Any]) -> list[Op]:
    ops = [
        Op(op["operationId"], verb.upper(), path, op)
        for path, verbs in document["paths"].items()
        for verb, op in verbs.items()
    ]
    return sorted(ops, key=lambda o: o.name)


def render_client(document: dict[str, Any]) -> str:
    schemas: dict[str, Any] = document["components"]["schemas"]
    parts = [HEADER.rstrip("\n")]
    parts += [typed_dict(name, schemas[name]) for name in _ordered(schemas)]
    ops = _operations(document)
    modules = sorted({o.module for o in ops})
    for aio in (False, True):
        prefix, transport = ("Async", "AsyncTransport") if aio else ("", "SyncTransport")
        for module in modules:
            lines = [
                f"class {prefix}{pascal(module)}Api:",
                f'    """The `{module}` methods."""',
                "",
                f"    def __init__(self, transport: {transport}) -> None:",
                "        self._t = transport",
            ]
            for op in (o for o in ops if o.module == module):
                lines.append("")
                lines += (_compute_methods if op.compute else _seed_methods)(op, schemas, aio)
            parts.append("\n".join(lines))
        lines = [
            f"class {prefix}Methods:",
            '    """Every API method, one attribute per module."""',
            "",
            f"    def __init__(self, transport: {transport}) -> None:",
        ]
        lines += [f"        self.{snake(m)} = {prefix}{pascal(m)}Api(transport)" for m in modules]
        parts.append("\n".join(lines))
    return "\n\n\n".join(parts) + "\n"


def main(argv: list[str]) -> int:
    path = Path(argv[0]) if argv else TARGET
    path.write_text(render_client(generated_document()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
