"""An operator's TOML file parsed, and where a key of it is, for errors that name file,
line and field (`tomllib` gives values, not lines): the rate card's and the tenant
rules' refusals."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Sequence
from typing import Any


def table_line(lines: Sequence[str], table: str, index: int, key: str | None) -> int:
    """The line of `[[table]]` number `index` (0-based), or of `key` inside it; the
    table's own line when the key is not written, 1 when the table is not found."""
    seen, start = -1, 0
    for no, text in enumerate(lines, 1):
        stripped = text.strip()
        if stripped.startswith(f"[[{table}]]"):
            seen += 1
            if seen == index:
                start = no
                if key is None:
                    return no
            elif seen > index:
                break
        elif seen == index and key is not None and re.match(rf"^{re.escape(key)}\s*=", stripped):
            return no
    return start or 1


def top_line(lines: Sequence[str], key: str) -> int:
    """The line of a top-level `key = …`, or 1."""
    for no, text in enumerate(lines, 1):
        if re.match(rf"^\s*{re.escape(key)}\s*=", text):
            return no
    return 1


def parsed(text: str, path: str, error: type[ValueError]) -> dict[str, Any]:
    """The document in `text`, or `error` naming `path`."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{path}: does not parse: {exc}") from None
