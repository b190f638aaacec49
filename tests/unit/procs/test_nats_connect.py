"""The first NATS connect, retried in one place (`procs.nats_connect.connect`) for every
process: a process that words its own failures (the Slurm bridge tells a refused user
from an unreachable server, each throttled) says so through `on_failure`, rather than
writing its own retry loop around a single try."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ops.kit.embedded_nats import free_port
from procs.nats import NatsSettings
from procs.nats_connect import CONNECT_ERRORS, Retry, connect

ROOT = Path(__file__).resolve().parents[3]


async def test_each_failed_try_but_the_last_is_handed_to_on_failure() -> None:
    failures: list[BaseException] = []
    nats = NatsSettings(url=f"nats://127.0.0.1:{free_port()}")
    retry = Retry(first_s=0.01, max_s=0.01, attempts=3)
    with pytest.raises(CONNECT_ERRORS):
        await connect(
            nats,
            # nats-py's own tries within one: each server twice, 10 ms apart.
            {"connect_timeout": 1, "max_reconnect_attempts": 1, "reconnect_time_wait": 0.01},
            retry=retry,
            on_failure=failures.append,
        )
    assert len(failures) == 2
    assert all(isinstance(exc, CONNECT_ERRORS) for exc in failures)


def test_no_process_retries_a_connect_in_a_loop_of_its_own() -> None:
    """A `connect(...)` inside a `while` outside procs/ is a second reconnect loop."""
    wrong = []
    for package in ("agent", "coordinator", "ops"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for loop in ast.walk(ast.parse(path.read_text())):
                if not isinstance(loop, ast.While):
                    continue
                for node in ast.walk(loop):
                    if (
                        isinstance(node, ast.Call)
                        and isinstance(node.func, ast.Name)
                        and node.func.id == "connect"
                    ):
                        wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert wrong == []
