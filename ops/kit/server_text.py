"""Server strings made inert before a client prints them (issue 32). Owners, reasons,
hostnames and labels come from agents, tenants and processes' environments: a
`GPUFLEET_RESERVATION_ID` of `ESC ] 52 ; c ; … ESC \\` would write an operator's
clipboard, `ESC [ 2 J` clear the screen, rich markup (`[link=…]`) hide a hyperlink, a
cell starting with `=` run a formula in a spreadsheet.

- `shown`: every C0 and C1 control (newline, tab and ESC included) and DEL written
  visibly as `\\xNN`, so nothing a server says moves the cursor, ends a line or starts
  an escape sequence; bidi and line-separator format characters as `\\uNNNN`. Rich
  markup is not escaped here: the table printer hands cells to rich as plain `Text`,
  never as markup.
- `csv_cell`: a string cell starting with `=`, `+`, `-`, `@`, a tab or a carriage
  return prefixed with `'` (as OWASP advises against CSV injection), then `shown`;
  numbers are written as they are.

JSON output needs neither: `json.dumps` writes every control character as `\\u00NN`.
"""

from __future__ import annotations

import re
from typing import Any

# C0 (U+0000–U+001F), DEL (U+007F) and C1 (U+0080–U+009F); and the format characters
# that reorder or break what follows (bidi marks, embeddings, overrides and isolates;
# line and paragraph separators), which would make one string read as another.
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u2028-\u202e\u2066-\u2069]")
# Where a spreadsheet would start a formula (OWASP, "CSV Injection").
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def shown(text: str) -> str:
    """`text` with every control character written visibly (`\\xNN`, `\\uNNNN`)."""
    return _CONTROLS.sub(_visible, text)


def shown_lines(text: str) -> str:
    """`text` the client composed of lines, each `shown`: its own newlines kept."""
    return "\n".join(shown(line) for line in text.split("\n"))


def shown_values(value: Any) -> Any:
    """A server's answer with every string in it `shown`, before a client composes
    lines of it."""
    if isinstance(value, str):
        return shown(value)
    if isinstance(value, dict):
        return {k: shown_values(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shown_values(v) for v in value]
    return value


def csv_cell(value: Any) -> Any:
    """A CSV cell a spreadsheet reads as text: formulas neutralised, controls shown."""
    if not isinstance(value, str):
        return value
    if value.startswith(_FORMULA_STARTS):
        value = "'" + value
    return shown(value)
