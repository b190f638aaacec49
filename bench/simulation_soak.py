"""Truth soak (SPEC §8 "Truth"): the ledger simulation of
tests/integration/test_simulation.py run for much longer than CI does — N random
sequences of fleet changes, bookings and clock moves through the real services and
ledger, the reference model checked after every step — on SQLite and, when reachable,
PostgreSQL, plus rounds of the concurrent variant (writers and two replicas on
PostgreSQL); and the same search against a ledger with a planted claim bug, which it
must catch. Reports sequences run and invariant violations found (each with the seed
that replays it), as a table and bench/results/simulation.json.

    .venv/bin/python bench/simulation_soak.py [--sequences 500] [--batch 25] [--steps 40]
        [--concurrent-rounds 5] [--concurrent-seconds 10] [--databases sqlite,postgresql]

A violation found here is a bug: replay it with the printed seed in the CI test
(`GPUFLEET_SIM_SEED=<seed> GPUFLEET_SIM_EXAMPLES=<batch> pytest
tests/integration/test_simulation.py -k <database>`), which shrinks it to the minimal
sequence.
"""

from __future__ import annotations

import argparse
import asyncio
import json
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

from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis.stateful import run_state_machine_as_test

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


def soak(
    url: str, ledger_class: type[Ledger], args: argparse.Namespace, budget: int
) -> dict[str, Any]:
    """Batches of `args.batch` sequences, each batch with a seed of its own, until
    `budget` sequences ran; a failing batch is recorded (not shrunk) and the next
    batch goes on. A planted ledger stops at its first catch."""
    options = settings(
        max_examples=args.batch,
        stateful_step_count=args.steps,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
        phases=[Phase.generate],
    )
    stats: Counter[str] = Counter()
    found: list[dict[str, Any]] = []
    started = time.perf_counter()
    with asyncio.Runner() as runner:
        ledger = runner.run(ledger_class.open(url))
        db = Database(url)
        glue = Glue(runner, ledger, db, stats)
        try:
            while stats["sequences"] < budget:
                chosen = random.randrange(2**32)
                try:
                    run_state_machine_as_test(seed(chosen)(machine_for(glue)), settings=options)
                except Exception as exc:  # an invariant, or anything the ledger raised
                    found.append({"seed": chosen, "error": f"{type(exc).__name__}: {exc}"[:2000]})
                    if ledger_class is not Ledger:
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sequences", type=int, default=500, help="per database")
    p.add_argument("--batch", type=int, default=25)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--planted-budget", type=int, default=300)
    p.add_argument("--concurrent-rounds", type=int, default=5)
    p.add_argument("--concurrent-seconds", type=float, default=10.0)
    p.add_argument("--databases", default="sqlite,postgresql")
    args = p.parse_args()
    kinds = [k for k in args.databases.split(",") if k]
    if "postgresql" in kinds and not postgres_reachable():
        print("PostgreSQL not reachable: SQLite only", file=sys.stderr)
        kinds.remove("postgresql")

    results: dict[str, Any] = {"settings": vars(args), "runs": {}}
    for kind in kinds:
        with scratch_database(kind) as url:
            results["runs"][kind] = soak(url, Ledger, args, args.sequences)
        with scratch_database(kind) as url:
            results["runs"][f"{kind}, planted claim bug"] = soak(
                url, PlantedLedger, args, args.planted_budget
            )
    if "postgresql" in kinds:
        rounds: list[dict[str, Any]] = []
        for _ in range(args.concurrent_rounds):
            chosen = random.randrange(2**32)
            with scratch_database("postgresql") as url:
                outcome = asyncio.run(
                    run_concurrently(
                        url,
                        seconds=args.concurrent_seconds,
                        writers=4,
                        seed=chosen,
                    )
                )
            rounds.append(
                {
                    "seed": chosen,
                    "violations": outcome.violations,
                    "drift": outcome.drift,
                    "operations": dict(sorted(outcome.operations.items())),
                }
            )
        results["runs"]["postgresql, concurrent"] = {
            "sequences": len(rounds),
            "steps": sum(sum(r["operations"].values()) for r in rounds),
            "violations": sum(len(r["violations"]) for r in rounds),
            "found": [r for r in rounds if r["violations"]],
            "rounds": rounds,
        }

    print(f"{'run':34} {'sequences':>9} {'steps':>7} {'violations':>10}  note")
    for name, run in results["runs"].items():
        planted = "planted" in name
        if planted:
            note = "caught" if run["violations"] else "NOT CAUGHT"
        else:
            note = "ok" if not run["violations"] else "VIOLATIONS (seeds in the JSON)"
        print(f"{name:34} {run['sequences']:>9} {run['steps']:>7} {run['violations']:>10}  {note}")
    for name, run in results["runs"].items():
        if "planted" not in name:
            for f in run["found"]:
                print(f"\n{name}, seed {f.get('seed')}:\n{f.get('error') or f.get('violations')}")
    out = HERE / "results" / "simulation.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
