"""How the CLI prints: a `View` (sections of rows, plus the data behind them) rendered as
a table, a wide table, JSON or CSV, with times in RFC 3339 (UTC, or local with --local).

Table is the default on a terminal, JSON when stdout is piped; `-o` chooses. JSON is
the API's answer with its epoch-millisecond times written as RFC 3339 strings; every
other value is as the API sent it. Server strings are printed inert
(`ops.kit.server_text`): control characters shown as `\\xNN` in tables and lines, never
read as rich markup; CSV cells neutralised against formulas.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import IO, Any, Literal

from ops.kit.server_text import csv_cell, shown

Format = Literal["table", "wide", "json", "csv"]
FORMATS: tuple[Format, ...] = ("table", "wide", "json", "csv")

# Keys whose integer values are epoch milliseconds in the API's answers.
TIME_KEYS = frozenset(
    {
        "asOf", "at", "createdAt", "end", "endedAt", "from", "idleSince", "lastSeen",
        "leaseExpiresAt", "preemptAt", "previousEnd", "revokedAt", "since", "start", "startsAt",
        "to", "until", "updatedAt",
    }
)  # fmt: skip
_EPOCH_MS_FLOOR = 100_000_000_000  # 1973: smaller integers under these keys are not times


def format_time(ms: int | None, local: bool = False, precise: bool = True) -> str:
    """RFC 3339: UTC with `Z`, or local with its offset; milliseconds when `precise`."""
    if ms is None:
        return "-"
    dt = datetime.fromtimestamp(ms / 1000, tz=UTC)
    if local:
        dt = dt.astimezone()
    text = dt.isoformat(timespec="milliseconds" if precise and ms % 1000 else "seconds")
    return text.replace("+00:00", "Z") if not local else text


def with_times(value: Any, local: bool = False) -> Any:
    """The value with every epoch-ms time under a known key as RFC 3339."""
    if isinstance(value, dict):
        return {
            k: (
                format_time(v, local)
                if k in TIME_KEYS and type(v) is int and v >= _EPOCH_MS_FLOOR
                else with_times(v, local)
            )
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [with_times(v, local) for v in value]
    return value


@dataclass(frozen=True)
class Column:
    key: str
    header: str
    wide: bool = False  # shown only with -o wide
    right: bool = False  # numbers
    time: bool = False  # an epoch-ms value shown as RFC 3339


@dataclass
class Section:
    columns: Sequence[Column]
    rows: list[dict[str, Any]]
    title: str = ""
    empty: str = "(none)"


@dataclass
class View:
    """What a command shows: `data` for JSON, `sections` for tables and CSV (the last
    section is the CSV one), `lines` said before the tables."""

    data: Any
    sections: list[Section] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Printer:
    fmt: Format
    local: bool
    out: IO[str]
    terminal: bool

    def cell(self, column: Column, value: Any) -> str:
        """A table cell's text, with the server's control characters shown inert."""
        return shown(self._cell(column, value))

    def _cell(self, column: Column, value: Any) -> str:
        if value is None or value == "":
            return "-"
        if column.time and isinstance(value, int):
            return format_time(value, self.local, precise=False)
        if isinstance(value, bool):
            return "yes" if value else "no"
        if isinstance(value, float):
            return f"{value:.2f}"
        if isinstance(value, list | tuple):
            return ",".join(str(v) for v in value) or "-"
        return str(value)

    def json(self, data: Any) -> None:
        self.out.write(json.dumps(with_times(data, self.local), indent=2) + "\n")

    def text(self, line: str) -> None:
        self.out.write(line + "\n")

    def show(self, view: View) -> None:
        if self.fmt == "json":
            self.json(view.data)
        elif self.fmt == "csv":
            self._csv(view.sections[-1] if view.sections else Section([], []))
        else:
            for line in view.lines:
                self.text(shown(line))
            for k, section in enumerate(view.sections):
                if k or view.lines:
                    self.text("")
                self._table(section)
        self.out.flush()

    def _visible(self, section: Section) -> list[Column]:
        return [c for c in section.columns if self.fmt == "wide" or not c.wide]

    def _csv(self, section: Section) -> None:
        columns = section.columns
        writer = csv.writer(self.out, lineterminator="\n")
        writer.writerow([c.key for c in columns])
        for row in section.rows:
            writer.writerow(
                [
                    format_time(row.get(c.key), self.local)
                    if c.time and isinstance(row.get(c.key), int)
                    else ("" if row.get(c.key) is None else csv_cell(row.get(c.key)))
                    for c in columns
                ]
            )

    def _table(self, section: Section) -> None:
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text

        if section.title:
            self.text(shown(section.title))  # it may name a pool
        if not section.rows:
            self.text(section.empty)
            return
        columns = self._visible(section)
        table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
        for c in columns:
            table.add_column(c.header, justify="right" if c.right else "left", overflow="fold")
        for row in section.rows:
            # Plain Text: a server string is never read as markup (`[link=…]`).
            table.add_row(*(Text(self.cell(c, row.get(c.key))) for c in columns))
        buffer = io.StringIO()
        console = Console(
            file=buffer,
            width=None if self.terminal else 10_000,
            force_terminal=self.terminal,
            color_system="auto" if self.terminal else None,
            highlight=False,
            soft_wrap=False,
        )
        console.print(table)
        for line in buffer.getvalue().splitlines():
            self.text(line if self.terminal else line.rstrip())


def default_format(stream: IO[str] = sys.stdout) -> Format:
    return "table" if stream.isatty() else "json"
