"""How the ledger simulation searches (issue 29): from a fixed seed, within a fixed
number of sequences and steps — never a number of seconds — and what a search did, so
that a seed can be shown to replay exactly.

A search runs the machine under hypothesis' `Verbosity.debug`, whose printout names
each step it draws (`state.create(shape='gpu', …)`). That printout is kept, not shown:
its steps, in order, are one half of the search's record; the other is the glue's trace,
what each step did and left in the ledger (`Glue.trace`). The same seed gives the same
steps and the same trace in any process, under any `PYTHONHASHSEED`, in any position in
the suite: nothing the machine does comes from anything but hypothesis' draws.

    .venv/bin/python -m tests.simulation.search <database url> <seed> <sequences> <steps>

prints a search's steps and its digest (the replay test runs it in a fresh process).
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout
from dataclasses import dataclass

import hypothesis
from hypothesis import HealthCheck, Phase, Verbosity, reproduce_failure, seed, settings
from hypothesis.stateful import run_state_machine_as_test

from coordinator.ledger import Database, Ledger
from tests.simulation.base import Glue
from tests.simulation.machine import machine_for

# Lines of the printout that are not steps: the machine's invariant, run after each.
_NOT_STEPS = ("state.ledger_is_true()", "state.teardown()")


def options(sequences: int, steps: int, *, shrink: bool = False) -> settings:
    """A search of `sequences` sequences of `steps` steps: no example database (a run
    must not depend on what an earlier one found), no deadline, no health checks (every
    step is real transactions), and no shrinking unless asked for (minutes)."""
    return settings(
        max_examples=sequences,
        stateful_step_count=steps,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
        print_blob=True,
        report_multiple_bugs=False,
        phases=[Phase.explicit, Phase.generate, *([Phase.shrink] if shrink else [])],
    )


@contextmanager
def glue(url: str, ledger_class: type[Ledger] = Ledger, namespace: str = "sim") -> Iterator[Glue]:
    """A loop and a ledger of `ledger_class` on `url` for a search's machines, and a
    second one on the same database: another coordinator replica."""
    with asyncio.Runner() as runner:
        ledger = runner.run(ledger_class.open(url))
        replica = runner.run(ledger_class.open(url))
        db = Database(url)
        try:
            yield Glue(runner, ledger, db, namespace=namespace, replica=replica)
        finally:
            runner.run(db.dispose())
            runner.run(replica.close())
            runner.run(ledger.close())


@dataclass
class Searched:
    """What one search did."""

    seed: int
    steps: list[str]  # every step drawn, in order (a failure's final replay not again)
    sequences: int  # sequences begun, the one that failed included
    error: Exception | None  # what ended the search early; None: it ran its budget
    trace: list[str]
    seconds: float

    def digest(self) -> str:
        """One digest of the steps and the trace: equal for two exact replays."""
        text = "\n".join([*self.steps, "--", *self.trace])
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def search(g: Glue, chosen: int, within: settings, *, blob: str | None = None) -> Searched:
    """Search from seed `chosen` within `within`'s budget (`options`); with `blob` (a
    printed `@reproduce_failure` argument) run that one example only. An exception that
    ends the search is kept in the answer, with a note of the seed that replays it."""
    machine = seed(chosen)(machine_for(g))
    if blob:
        machine = reproduce_failure(hypothesis.__version__, blob.encode())(machine)
    printed = io.StringIO()
    error: Exception | None = None
    started = time.perf_counter()
    with redirect_stdout(printed):
        try:
            run_state_machine_as_test(machine, settings=settings(within, verbosity=Verbosity.debug))
        except Exception as exc:
            exc.add_note(
                f"replay with GPUFLEET_SIM_SEED={chosen} "
                "(tests/integration/coordinator/ledger/test_simulation.py)"
            )
            error = exc
    seconds = time.perf_counter() - started
    lines = printed.getvalue().splitlines()
    return Searched(
        seed=chosen,
        steps=[s for s in lines if s.startswith("state.") and s not in _NOT_STEPS],
        sequences=sum(s.startswith("state = ") for s in lines),
        error=error,
        trace=list(g.trace),
        seconds=round(seconds, 1),
    )


def main(argv: list[str]) -> None:
    url, chosen, sequences, steps = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    with glue(url, namespace="sub") as g:
        found = search(g, chosen, options(sequences, steps))
    print("\n".join(found.steps))
    print(f"digest {found.digest()} steps {len(found.steps)} error {found.error!r:.200}")


if __name__ == "__main__":
    main(sys.argv[1:])
