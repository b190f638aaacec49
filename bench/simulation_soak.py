"""Truth soak (SPEC §8 "Truth"): the ledger simulation of
tests/integration/coordinator/ledger/test_simulation.py run for much longer than CI does — N random
sequences of fleet changes, bookings and clock moves through the real services and
ledger, the reference model checked after every step — on SQLite and, when reachable,
PostgreSQL, plus rounds of the concurrent variant (writers and two replicas on
PostgreSQL); and searches for every planted bug (`tests/simulation/planted.py`, A–E and
issue 31's 31c–31e) from fresh seeds, each within a budget of sequences, which must
catch it. Reports sequences and steps run, invariant violations found (each with the
seed that replays it) and the steps each plant took to catch, as a table and
bench/results/simulation.json.

    .venv/bin/python bench/simulation_soak.py [--sequences 500] [--batch 25] [--steps 40]
        [--plants A,B,...] [--planted-searches 3] [--planted-budget 30]
        [--concurrent-rounds 5] [--concurrent-operations 80] [--databases sqlite,postgresql]

Every search is bounded in sequences and steps (`--sequences`, `--planted-budget`, of
`--steps` steps; the plants' always of 30, as in CI), never in seconds. A violation found
here is a bug: replay it with the printed seed in the CI test
(`GPUFLEET_SIM_SEED=<seed> GPUFLEET_SIM_EXAMPLES=<batch> GPUFLEET_SIM_STEPS=<steps>
GPUFLEET_SIM_SHRINK=1 pytest tests/integration/coordinator/ledger/test_simulation.py
-k keep_the_ledger`), which shrinks it to the minimal sequence; a seed replays exactly,
in any process. A plant seed that catches quickly can replace a plant's seed in
planted.py (run its test to measure the step and write it there).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import secrets
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import pytest
from report import Goal, write

from tests.simulation.concurrent import run_concurrently
from tests.simulation.planted import PLANTS, Plant, hunt
from tests.simulation.search import Searched, glue, options, search

HERE = Path(__file__).resolve().parent
PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/test"


async def _pg(sql: str) -> None:
    import asyncpg  # type: ignore[import-untyped]

    conn = await asyncio.wait_for(asyncpg.connect(PG_ADMIN), timeout=5)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@contextmanager
def scratch_database(kind: str) -> Iterator[str]:
    if kind == "sqlite":
        with tempfile.TemporaryDirectory() as d:
            yield f"sqlite:///{d}/soak.db"
        return
    name = f"gpufleet_soak_{secrets.token_hex(4)}"
    asyncio.run(_pg(f"CREATE DATABASE {name}"))
    try:
        yield f"{PG_ADMIN.rsplit('/', 1)[0]}/{name}"
    finally:
        asyncio.run(_pg(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))


def postgres_reachable() -> bool:
    try:
        asyncio.run(_pg("SELECT 1"))
    except Exception:
        return False
    return True


def _fresh_seed() -> int:
    return random.randrange(2**32)


def soak(kind: str, args: argparse.Namespace) -> dict[str, Any]:
    """Batches of `args.batch` sequences of `args.steps` steps, each batch from a fresh
    seed, until `args.sequences` sequences ran. A failing batch is recorded (not
    shrunk) with its seed and the sequences it took."""
    found: list[dict[str, Any]] = []
    steps = seconds = 0.0
    with scratch_database(kind) as url, glue(url) as g:
        while g.stats["sequences"] < args.sequences:
            run = search(g, _fresh_seed(), options(args.batch, args.steps))
            steps, seconds = steps + len(run.steps), seconds + run.seconds
            if run.error is not None:  # an invariant, or anything the ledger raised
                found.append(_failure(run))
        stats = dict(sorted(g.stats.items()))
    return {
        "sequences": stats["sequences"],
        "steps": int(steps),
        "violations": len(found),
        "found": found,
        "seconds": round(seconds, 1),
        "operations": stats,
    }


def _failure(run: Searched) -> dict[str, Any]:
    return {
        "seed": run.seed,
        "sequences": run.sequences,
        "steps": len(run.steps),
        "error": (
            f"{type(run.error).__name__}: {run.error}"[:2000]
            if run.error is not None
            else f"not caught in {len(run.steps)} steps ({run.sequences} sequences)"
        ),
    }


def planted(kind: str, plant: Plant, args: argparse.Namespace) -> dict[str, Any]:
    """`args.planted_searches` searches for `plant`, each from a fresh seed, within
    `args.planted_budget` sequences: how many steps the simulation needs to find the bug
    (what a real bug like it would cost to find)."""
    runs: list[Searched] = []
    for _ in range(args.planted_searches):
        with scratch_database(kind) as url, pytest.MonkeyPatch.context() as mp:
            runs.append(hunt(plant, url, mp, seed=_fresh_seed(), sequences=args.planted_budget))
    caught = [r for r in runs if r.error is not None and re.search(plant.caught_as, str(r.error))]
    until = sorted(len(r.steps) for r in caught)
    return {
        "plant": plant.name,
        "searches": len(runs),
        "caught": len(caught),
        "sequences": sum(r.sequences for r in runs),
        "steps": sum(len(r.steps) for r in runs),
        "violations": len(caught),
        "steps_until_caught": until,
        "median_until_caught": until[len(until) // 2] if until else None,
        "missed": [_failure(r) for r in runs if r not in caught],
        "seconds": round(sum(r.seconds for r in runs), 1),
    }


def concurrent(args: argparse.Namespace) -> dict[str, Any]:
    rounds: list[dict[str, Any]] = []
    for _ in range(args.concurrent_rounds):
        chosen = random.randrange(2**32)
        with scratch_database("postgresql") as url:
            outcome = asyncio.run(
                run_concurrently(url, operations=args.concurrent_operations, writers=4, seed=chosen)
            )
        rounds.append(
            {
                "seed": chosen,
                "violations": outcome.violations,
                "drift": outcome.drift,
                "operations": dict(sorted(outcome.operations.items())),
            }
        )
    return {
        "sequences": len(rounds),
        "steps": sum(sum(r["operations"].values()) for r in rounds),
        "violations": sum(len(r["violations"]) for r in rounds),
        "found": [r for r in rounds if r["violations"]],
        "rounds": rounds,
    }


def goals_of(runs: dict[str, Any], args: argparse.Namespace) -> list[Goal]:
    goals = []
    for name, run in runs.items():
        value = f"{run['sequences']:,} sequences, {run['steps']:,} steps"
        value += f", {run['violations']} violations"
        if "plant" in run:
            until = run["steps_until_caught"]
            budget = args.planted_budget * 30
            goals.append(
                Goal(
                    f"{name}: caught",
                    f"{run['caught']} of {run['searches']} searches, after {until} steps",
                    f"median {run['median_until_caught']} of a {budget}-step budget",
                    "every search",
                    run["caught"] == run["searches"],
                )
            )
        else:
            goals.append(
                Goal(f"{name}: invariant violations", value, "", "0", not run["violations"])
            )
    return goals


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sequences", type=int, default=500, help="per database")
    p.add_argument("--batch", type=int, default=25)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--plants", default="", help="name prefixes, e.g. A,E,31c; default all")
    p.add_argument("--planted-searches", type=int, default=3)
    p.add_argument("--planted-budget", type=int, default=30, help="sequences per search")
    p.add_argument("--concurrent-rounds", type=int, default=5)
    p.add_argument("--concurrent-operations", type=int, default=80, help="per writer")
    p.add_argument("--databases", default="sqlite,postgresql")
    args = p.parse_args()
    kinds = [k for k in args.databases.split(",") if k]
    if "postgresql" in kinds and not postgres_reachable():
        print("PostgreSQL not reachable: SQLite only", file=sys.stderr)
        kinds.remove("postgresql")

    wanted = [w.strip().upper() for w in args.plants.split(",") if w.strip()]
    plants = [
        p for n, p in sorted(PLANTS.items()) if not wanted or n.split("-")[0].upper() in wanted
    ]

    runs: dict[str, Any] = {}
    for kind in kinds:
        if args.sequences:
            runs[kind] = soak(kind, args)
        for plant in plants:
            runs[f"{kind}, plant {plant.name}"] = planted(kind, plant, args)
    if "postgresql" in kinds and args.concurrent_rounds:
        runs["postgresql, concurrent"] = concurrent(args)
    for name, run in runs.items():
        for f in run.get("found", []) + run.get("missed", []):
            print(f"\n{name}, seed {f.get('seed')}:\n{f.get('error') or f.get('violations')}")
    sys.exit(write("simulation", {"settings": vars(args), "runs": runs}, goals_of(runs, args)))


if __name__ == "__main__":
    main()
