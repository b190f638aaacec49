"""What every benchmark reports the same way: goal rows (figure, value, ratio to the
baseline measured in the same run, goal, met or missed), printed as a table and written
with the benchmark's own figures to bench/results/<name>.json, where `bench/summary.py`
collects them into the one table `bench/run` ends with.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Goal:
    figure: str
    value: str
    ratio: str  # to the baseline measured in the same run ("" when the goal is absolute)
    goal: str
    met: bool


def table(goals: list[Goal]) -> str:
    head = ("figure", "value", "ratio", "goal", "")
    rows = [head]
    rows += [(g.figure, g.value, g.ratio, g.goal, "met" if g.met else "MISSED") for g in goals]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = []
    for r in rows:
        cells = [r[0].ljust(widths[0])]
        cells += [c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True)]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def write(name: str, result: dict[str, Any], goals: list[Goal]) -> int:
    """Print the goal table, write the JSON; the exit status: 0 when every goal is met."""
    print(table(goals))
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"{name}.json"
    out.write_text(json.dumps({**result, "summary": [asdict(g) for g in goals]}, indent=2) + "\n")
    print(f"wrote {out}")
    return 0 if all(g.met for g in goals) else 1


def read(name: str) -> list[Goal] | None:
    """The goal rows a benchmark wrote (None: it wrote none, it crashed)."""
    path = RESULTS / f"{name}.json"
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    return [Goal(**row) for row in data.get("summary", [])] or None
