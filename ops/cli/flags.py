"""Flags from the API's input schemas, and their values back into a request body.

One option per input field (`poolId` → `--pool-id`): strings, numbers and booleans
typed, enums as choices, lists repeatable (or comma-separated), objects as `k=v,k=v`
typed from the nested schema or as JSON, lists of objects one repeated flag per item.
Time fields (`start`, `from`, `to`) take epoch milliseconds, RFC 3339, a date,
`now`, or an offset such as `-7d`, `+2h`, `now+30m`.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import click

from ops.cli.api_spec import MethodSpec, Param
from shared.rfc3339 import NoOffset, OffMillisecondGrid, TimeTextError, parse_ms

TIME_PARAMS = frozenset({"start", "from", "to", "after_time"})
_OFFSET = re.compile(r"^(now)?\s*([+-])\s*([0-9]+(?:\.[0-9]+)?)\s*(s|m|h|d|w)$")
_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}


class BadValue(click.BadParameter):
    pass


def parse_when(text: str, now_ms: int | None = None) -> int:
    """A point in time → epoch milliseconds, exactly: an RFC 3339 time by the API's one
    rule (`shared.rfc3339`), so a fraction that is not whole milliseconds is refused
    rather than truncated, and so is an offset that comes to one (`+0.0001s`)."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    value = text.strip()
    if re.fullmatch(r"[0-9]+", value):
        return int(value)
    if value.lower() == "now":
        return now
    m = _OFFSET.match(value.lower())
    if m:
        # Decimal, not float: `+0.1s` is 100 ms exactly, and a sub-millisecond rest shows.
        amount = Decimal(m.group(3)) * _UNIT_MS[m.group(4)]
        if amount != amount.to_integral_value():
            raise BadValue(f"{text!r} is not a whole number of milliseconds")
        return now + int(amount) if m.group(2) == "+" else now - int(amount)
    if re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", value):
        try:
            return parse_ms(f"{value}T00:00:00Z")
        except TimeTextError:
            raise BadValue(f"{text!r} is not a date") from None
    try:
        return parse_ms(value)
    except OffMillisecondGrid:
        raise BadValue(f"{text!r} has a fraction below the millisecond") from None
    except NoOffset:
        raise BadValue(f"{text!r} has no UTC offset (add Z or ±hh:mm)") from None
    except TimeTextError:
        raise BadValue(
            f"{text!r} is not a time (epoch ms, RFC 3339, YYYY-MM-DD, now, -7d, +2h)"
        ) from None


def _scalar(param: Param, text: str) -> Any:
    kind = param.item if param.kind == "list" else param.kind
    try:
        if param.name in TIME_PARAMS and kind == "int":
            return parse_when(text)
        if kind == "int":
            return int(text)
        if kind == "float":
            return float(text)
        if kind == "bool":
            lowered = text.strip().lower()
            if lowered not in ("true", "false", "yes", "no", "1", "0"):
                raise ValueError(text)
            return lowered in ("true", "yes", "1")
        if kind == "any":
            try:
                return json.loads(text)
            except ValueError:
                return text
    except ValueError:
        raise BadValue(f"{param.name}: {text!r} is not {kind}") from None
    if param.choices and text not in param.choices:
        raise BadValue(f"{param.name}: {text!r} is not one of {', '.join(param.choices)}")
    return text


def _object(param: Param, text: str) -> Any:
    stripped = text.strip()
    if stripped.startswith(("{", "[")):
        try:
            return json.loads(stripped)
        except ValueError as exc:
            raise BadValue(f"{param.name}: not JSON ({exc})") from None
    out: dict[str, Any] = {}
    by_name = {p.name: p for p in param.nested}
    for pair in filter(None, (p.strip() for p in stripped.split(","))):
        key, sep, value = pair.partition("=")
        if not sep:
            raise BadValue(f"{param.name}: {pair!r} is not key=value")
        nested = by_name.get(key.strip())
        if nested is None:
            known = ", ".join(by_name) or "none"
            raise BadValue(f"{param.name}: unknown key {key.strip()!r} (known: {known})")
        out[nested.name] = (
            _scalar(nested, value.strip())
            if nested.kind not in ("object", "objects", "list")
            else _object(nested, value)
        )
    return out


def option(param: Param) -> click.Option:
    help_text = param.describe()
    if param.name in TIME_PARAMS and param.kind == "int":
        help_text = "time: epoch ms, RFC 3339, YYYY-MM-DD, now, -7d, +2h"
    if param.kind == "bool":
        neg = "--no-" + param.flag[2:]
        return click.Option(
            [f"{param.flag}/{neg}", param.name], default=None, help=help_text + " (true/false)"
        )
    multiple = param.kind in ("list", "objects")
    return click.Option(
        [param.flag, param.name],
        multiple=multiple,
        default=None,
        metavar=_metavar(param),
        help=help_text,
        shell_complete=_complete(param),
    )


def _metavar(param: Param) -> str:
    if param.choices:
        return "[" + "|".join(param.choices) + "]"
    if param.kind in ("object", "objects"):
        return "K=V,…|JSON"
    if param.name in TIME_PARAMS:
        return "TIME"
    kind = param.item if param.kind == "list" else param.kind
    return {"int": "INT", "float": "NUMBER"}.get(kind, "TEXT")


def _complete(param: Param) -> Any:
    if not param.choices:
        return None
    choices = param.choices

    def complete(ctx: click.Context, p: click.Parameter, incomplete: str) -> list[str]:
        return [c for c in choices if c.startswith(incomplete)]

    return complete


def body_from(spec: MethodSpec, given: Mapping[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """The request body: `base` (from --json) with every flag given on top."""
    body = dict(base)
    for param in spec.params:
        value = given.get(param.name)
        if value is None or value == ():
            continue
        if param.kind == "bool":
            body[param.name] = bool(value)
        elif param.kind == "list":
            texts = [s for v in value for s in str(v).split(",") if s.strip()]
            body[param.name] = [_scalar(param, s.strip()) for s in texts]
        elif param.kind == "objects":
            items: list[Any] = []
            for v in value:
                parsed = _object(param, v)
                items += parsed if isinstance(parsed, list) else [parsed]
            body[param.name] = items
        elif param.kind == "object":
            body[param.name] = _object(param, value)
        else:
            body[param.name] = _scalar(param, str(value))
    return body


def missing(spec: MethodSpec, body: Mapping[str, Any]) -> list[str]:
    return [p.flag for p in spec.params if p.required and p.name not in body]
