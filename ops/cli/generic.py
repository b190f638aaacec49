"""Any API answer as a table, for `-o table|wide|csv` where no view or short answer is
made for it (`gpufleet api METHOD`, `gpufleet call`): its scalar fields as `key: value`
lines, nested objects as `key.sub: value`, and each list of objects as a table of its
scalar fields (anything deeper in a cell as compact JSON). The last list is the CSV."""

from __future__ import annotations

import json
from typing import Any

from ops.kit.output import TIME_KEYS, Column, Section, View, format_time

_MAX_DEPTH = 3


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


def _rows(items: list[Any]) -> list[dict[str, Any]]:
    """Each item's fields, a cell each: scalars as they are, lists of scalars as they
    are (the printer joins them), anything else as compact JSON."""
    out: list[dict[str, Any]] = []
    for item in items:
        row: dict[str, Any] = {}
        for key, value in item.items() if isinstance(item, dict) else [("value", item)]:
            plain = _scalar(value) or (isinstance(value, list) and all(map(_scalar, value)))
            row[key] = value if plain else json.dumps(value, separators=(",", ":"))
        out.append(row)
    return out


def _columns(rows: list[dict[str, Any]]) -> list[Column]:
    keys: dict[str, None] = {}
    for row in rows:
        keys.update(dict.fromkeys(row))

    def numeric(k: str) -> bool:
        values = [r.get(k) for r in rows if r.get(k) is not None]
        return k not in TIME_KEYS and all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in values
        )

    return [Column(k, k.upper(), right=numeric(k), time=k in TIME_KEYS) for k in keys]


def generic_view(answer: Any, local: bool = False) -> View:
    lines: list[str] = []
    sections: list[Section] = []

    def walk(prefix: str, value: Any, depth: int) -> None:
        if isinstance(value, dict) and depth < _MAX_DEPTH:
            for key, sub in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), sub, depth + 1)
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            rows = _rows(value)
            sections.append(Section(_columns(rows), rows, title=f"{prefix or 'items'}:"))
        elif isinstance(value, list) and not value:
            lines.append(f"{prefix}: (none)")
        else:
            key = prefix.rsplit(".", 1)[-1]
            if key in TIME_KEYS and type(value) is int:
                text = format_time(value, local)
            elif _scalar(value):
                text = "-" if value is None else str(value)
            elif isinstance(value, list) and all(map(_scalar, value)):
                text = ", ".join(str(v) for v in value)
            else:
                text = json.dumps(value, separators=(",", ":"))
            lines.append(f"{prefix or 'value'}: {text}")

    walk("", answer, 0)
    if len(sections) == 1 and not lines and isinstance(answer, list):
        sections[0].title = ""
    return View(answer, sections, lines)
