"""Truth soak (SPEC §8 "Truth"): the ledger simulation of
tests/integration/test_simulation.py run for much longer than CI does — N random
sequences of fleet changes, bookings and clock moves through the real services and
ledger, the reference model checked after every step — on SQLite and, when reachable,
PostgreSQL, plus rounds of the concurrent variant (writers and two replicas on
PostgreSQL); and the same search against a ledger with a planted claim bug, which it
must catch. Reports sequences run and invariant violations found (each with the seed
that replays it), as a table and bench/results/simulation.json.

    .venv/bin/python bench/simulation_soak.py [--sequences 500] [--batch 25] [--steps 40]
        [--planted-searches 3] [--planted-budget 300] [--concurrent-rounds 5]
        [--concurrent-seconds 10] [--databases sqlite,postgresql]

A violation found here is a bug: replay it with the printed seed in the CI test
(`GPUFLEET_SIM_SEED=<seed> GPUFLEET_SIM_EXAMPLES=<batch> GPUFLEET_SIM_SHRINK=1 pytest
tests/integration/test_simulation.py -k <database>`), which shrinks it to the minimal
sequence (the test runs 30 steps a sequence, the soak `--steps`: pass the same).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import secrets
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis.stateful import run_state_machine_as_test
from report import Goal, write

from coordinator.ledger import Database, Ledger
from tests.simulation.concurrent import run_concurrently
from tests.simulation.machine import Glue, machine_for
from tests.simulation.planted import PlantedLedger

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


def _options(args: argparse.Namespace) -> settings:
    return settings(
        max_examples=args.batch,
        stateful_step_count=args.steps,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
        phases=[Phase.generate],
    )


def _searches(
    url: str, ledger_class: type[Ledger], args: argparse.Namespace, budget: int, stop: bool
) -> dict[str, Any]:
    """Batches of `args.batch` sequences, each batch with a fresh seed, until `budget`
    sequences ran. A failing batch is recorded (not shrunk) with its seed and the
    sequences it took; with `stop` the first one ends the search."""
    stats: Counter[str] = Counter()
    found: list[dict[str, Any]] = []
    started = time.perf_counter()
    with asyncio.Runner() as runner:
        ledger = runner.run(ledger_class.open(url))
        db = Database(url)
        glue = Glue(runner, ledger, db, stats)
        try:
            while stats["sequences"] < budget:
                chosen, before = random.randrange(2**32), stats["sequences"]
                try:
                    machine = seed(chosen)(machine_for(glue))
                    run_state_machine_as_test(machine, settings=_options(args))
                except Exception as exc:  # an invariant, or anything the ledger raised
                    found.append(
                        {
                            "seed": chosen,
                            "sequences": stats["sequences"] - before,
                            "after": stats["sequences"],
                            "error": f"{type(exc).__name__}: {exc}"[:2000],
                        }
                    )
                    if stop:
                        break
        finally:
            runner.run(db.dispose())
            runner.run(ledger.close())
    return {
        "sequences": stats["sequences"],
        "steps": sum(n for k, n in stats.items() if k not in ("sequences", "violations")),
        "violations": len(found),
        "found": found,
        "seconds": round(time.perf_counter() - started, 1),
        "operations": dict(sorted(stats.items())),
    }


def soak(kind: str, args: argparse.Namespace) -> dict[str, Any]:
    with scratch_database(kind) as url:
        return _searches(url, Ledger, args, args.sequences, stop=False)


def planted(kind: str, args: argparse.Namespace) -> dict[str, Any]:
    """`args.planted_searches` searches of the planted ledger, each with seeds of its
    own, each until its first catch: how many sequences the simulation needs to find
    the bug (the soak's baseline: what a real bug like it would cost to find)."""
    runs = []
    for _ in range(args.planted_searches):
        with scratch_database(kind) as url:
            runs.append(_searches(url, PlantedLedger, args, args.planted_budget, stop=True))
    until = sorted(r["sequences"] for r in runs if r["violations"])
    return {
        "searches": len(runs),
        "caught": len(until),
        "sequences": sum(r["sequences"] for r in runs),
        "steps": sum(r["steps"] for r in runs),
        "violations": sum(r["violations"] for r in runs),
        "sequences_until_caught": until,
        "median_until_caught": until[len(until) // 2] if until else None,
        "found": [f for r in runs for f in r["found"]],
        "seconds": round(sum(r["seconds"] for r in runs), 1),
    }


def concurrent(args: argparse.Namespace) -> dict[str, Any]:
    rounds: list[dict[str, Any]] = []
    for _ in range(args.concurrent_rounds):
        chosen = random.randrange(2**32)
        with scratch_database("postgresql") as url:
            outcome = asyncio.run(
                run_concurrently(url, seconds=args.concurrent_seconds, writers=4, seed=chosen)
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
        if name.endswith("planted claim bug"):
            until = run["sequences_until_caught"]
            goals.append(
                Goal(
                    f"{name}: caught",
                    f"{run['caught']} of {run['searches']} searches, after {until} sequences",
                    f"median {run['median_until_caught']} of a {args.planted_budget} budget",
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
    p.add_argument("--planted-searches", type=int, default=3)
    p.add_argument("--planted-budget", type=int, default=300)
    p.add_argument("--concurrent-rounds", type=int, default=5)
    p.add_argument("--concurrent-seconds", type=float, default=10.0)
    p.add_argument("--databases", default="sqlite,postgresql")
    args = p.parse_args()
    kinds = [k for k in args.databases.split(",") if k]
    if "postgresql" in kinds and not postgres_reachable():
        print("PostgreSQL not reachable: SQLite only", file=sys.stderr)
        kinds.remove("postgresql")

    runs: dict[str, Any] = {}
    for kind in kinds:
        runs[kind] = soak(kind, args)
        runs[f"{kind}, planted claim bug"] = planted(kind, args)
    if "postgresql" in kinds and args.concurrent_rounds:
        runs["postgresql, concurrent"] = concurrent(args)
    for name, run in runs.items():
        if "planted" not in name:
            for f in run["found"]:
                print(f"\n{name}, seed {f.get('seed')}:\n{f.get('error') or f.get('violations')}")
    sys.exit(write("simulation", {"settings": vars(args), "runs": runs}, goals_of(runs, args)))


if __name__ == "__main__":
    main()
