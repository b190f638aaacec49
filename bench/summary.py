"""The one table `bench/run` ends with: every goal of every benchmark it ran, met or
missed, and benchmarks that crashed before writing their results. Exits 1 when
anything missed or crashed.

    .venv/bin/python bench/summary.py agent ingest detection registration placement
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from report import Goal, read, table


def main(names: list[str]) -> int:
    goals: list[Goal] = []
    for name in names:
        rows = read(name)
        if rows is None:
            goals.append(Goal(f"{name}: no results (it crashed)", "", "", "", False))
        else:
            goals += [Goal(f"{name}: {g.figure}", g.value, g.ratio, g.goal, g.met) for g in rows]
    print(table(goals))
    missed = sum(not g.met for g in goals)
    print(f"{len(goals) - missed} of {len(goals)} goals met")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
