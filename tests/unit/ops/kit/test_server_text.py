"""Server strings are inert in every printer (issue 32): tables, wide tables, lines and
CSV as `ops.kit.output` writes them for a terminal, and `alerts watch` lines."""

from __future__ import annotations

import csv
import io

import pytest

from ops.cli.alert_feed import alert_line
from ops.cli.answers import short_answer
from ops.kit.output import Column, Format, Printer, Section, View
from ops.kit.server_text import csv_cell, shown, shown_lines, shown_values

PAYLOAD = "\x1b]52;c;ZXZpbA==\x1b\\\x1b[2J[link=https://evil.example]rsv_ok[/link]\x9b31m\x07"


def test_every_c0_and_c1_control_is_shown_visibly() -> None:
    assert shown("a\x1bb\nc\td\x7fe\x85f\x9bg") == "a\\x1bb\\x0ac\\x09d\\x7fe\\x85f\\x9bg"
    assert shown("plain — ünïcode") == "plain — ünïcode"
    # Bidi overrides and line separators would make one string read as another.
    assert shown("rsv_\u202eko\u2028x\u2066") == "rsv_\\u202eko\\u2028x\\u2066"


@pytest.mark.parametrize(
    ("cell", "written"),
    [
        ('=HYPERLINK("https://evil.example")', '\'=HYPERLINK("https://evil.example")'),
        ("+1+cmd|' /C calc'!A0", "'+1+cmd|' /C calc'!A0"),
        ("-2+3", "'-2+3"),
        ("@SUM(A1)", "'@SUM(A1)"),
        ("\tx", "'\\x09x"),
        ("\rx", "'\\x0dx"),
        ("h100-a", "h100-a"),
        (-3, -3),
        (1.5, 1.5),
    ],
)
def test_csv_cells_are_neutralised_against_formulas(cell: object, written: object) -> None:
    assert csv_cell(cell) == written


def _printed(fmt: Format, terminal: bool = True) -> str:
    out = io.StringIO()
    view = View(
        data={},
        sections=[
            Section(
                [Column("node", "NODE"), Column("why", "WHY"), Column("n", "N", right=True)],
                [{"node": "h100-a", "why": PAYLOAD, "n": -1}, {"node": "=1+1", "why": "-", "n": 2}],
                title=f"pool {PAYLOAD}",
            )
        ],
        lines=[f"maintenance: {PAYLOAD}"],
    )
    Printer(fmt, False, out, terminal).show(view)
    return out.getvalue()


@pytest.mark.parametrize("fmt", ["table", "wide"])
def test_tables_and_lines_carry_no_escape_and_no_markup(fmt: Format) -> None:
    text = _printed(fmt)
    # Rich's own styling (the bold header) is the only escape on a terminal.
    server = text.replace("\x1b[1m", "").replace("\x1b[0m", "")
    assert "\x1b" not in server and "\x07" not in server and "\x9b" not in server
    assert "\x1b]8;" not in text  # no hyperlink
    assert "[link=https://evil.example]rsv_ok[/link]" in text  # the markup, as text
    assert text.count("\\x1b]52;c;ZXZpbA==") == 3  # line, title and cell, each visible


def test_csv_is_neutralised_and_inert() -> None:
    rows = list(csv.reader(io.StringIO(_printed("csv", terminal=False))))
    assert rows[0] == ["node", "why", "n"]
    assert rows[1][1].startswith("\\x1b]52;") and "\x1b" not in rows[1][1]
    assert rows[2] == ["'=1+1", "'-", "2"]
    assert rows[1][2] == "-1"  # a number is a number


def test_an_alert_line_is_inert() -> None:
    alert = {"kind": "gpu.foreignUse", "nodeId": "n0", "poolId": "p", "reason": PAYLOAD,
             "reservationId": PAYLOAD, "deviceId": "GPU-\x1b[2J"}  # fmt: skip
    line = alert_line(alert, "2026-12-01T00:00:00Z")
    assert "\x1b" not in line and "\x07" not in line and "\n" not in line
    assert "reservation=\\x1b]52;c;ZXZpbA==" in line


def test_one_line_answers_keep_their_own_lines_and_show_the_server_s_inert() -> None:
    answer = {"name": "train\n\x1b[2Jfake line", "offeredTo": ["globex"]}
    said = shown_lines(short_answer("pools.offer", {}, shown_values(answer)) or "")
    assert said == "pool train\\x0a\\x1b[2Jfake line offered to globex"
    assert shown_lines("shown once:\ngpf_x\x07") == "shown once:\ngpf_x\\x07"
