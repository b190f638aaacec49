"""The booking path's work, counted rather than timed (issue 30): Python bytecodes
executed per 32-client `reservations.create` (group commits of 32), per bare one-row
commit, per `capacity.preview` and per rollup read; SQL statements per commit group;
objects the cyclic collector tracks, net, per create. Same fleet and requests as
`placement_bench.py` (1,000 nodes half booked), on SQLite and, when reachable,
PostgreSQL.

Counts do not move with machine load, which on a shared machine moves wall-clock
ratios by 2-5x from one run to the next: they say whether a change made the path
cheaper. Bytecodes are counted with `sys.settrace` opcode events on the event loop's
thread (SQLite's own work runs in C on the driver's thread, PostgreSQL's in the server;
neither is counted), so a count is Python's work only. Slow under the tracer (about a
minute a database). Not part of `bench/run`:

    .venv/bin/python bench/booking_work_bench.py [--nodes 1000] [--each 4]
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import FrameType
from typing import Any

import uvloop
from sqlalchemy import event

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fleet import postgres_database, postgres_reachable
from placement_bench import bare_commits, creates, fleet, previews
from report import Goal, write


class Bytecodes:
    """Bytecodes executed on this thread inside the block."""

    def __init__(self) -> None:
        self.count = 0

    def _trace(self, frame: FrameType, kind: str, arg: object) -> Callable[..., Any]:
        frame.f_trace_opcodes = True
        if kind == "opcode":
            self.count += 1
        return self._trace

    def __enter__(self) -> Bytecodes:
        sys.settrace(self._trace)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.settrace(None)


async def counted(work: Callable[[], Awaitable[Any]]) -> int:
    with Bytecodes() as ops:
        await work()
    return ops.count


async def run_backend(url: str, nodes: int, each: int) -> dict[str, Any]:
    async with fleet(url, nodes) as (services, pool, now):
        ledger = services.ledger
        statements = [0]

        def count(*_: object) -> None:
            statements[0] += 1

        event.listen(ledger.database.engine.sync_engine, "before_cursor_execute", count)
        # Warm: the snapshot cache loaded, statements compiled, a few commit groups.
        await creates(services, pool, now, 32, 4)
        await bare_commits(ledger, now - 5, 20)
        n = 32 * each
        batches, before = services.reservations.batches_run, statements[0]
        create_ops = await counted(lambda: creates(services, pool, now, 32, each))
        batches = services.reservations.batches_run - batches
        per_batch = (statements[0] - before) / batches
        bare_ops = await counted(lambda: bare_commits(ledger, now + 7, 50))

        async def reads() -> None:
            for _ in range(50):
                await ledger.rollup([pool])

        read_ops = await counted(reads)
        preview_ops = await counted(lambda: previews(services, pool, now, 50))
        gc.collect()
        gc.disable()
        try:
            start = gc.get_count()[0]
            await creates(services, pool, now, 32, each)
            tracked = (gc.get_count()[0] - start) / n
        finally:
            gc.enable()
    return {
        "nodes": nodes,
        "create_bytecodes": round(create_ops / n),
        "bare_commit_bytecodes": round(bare_ops / 50),
        "preview_bytecodes": round(preview_ops / 50),
        "rollup_read_bytecodes": round(read_ops / 50),
        "statements_per_batch": round(per_batch, 1),
        "batch_mean": round(n / batches, 1),
        "tracked_objects_per_create": round(tracked, 1),
    }


async def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--each", type=int, default=4, help="creates per client (32 clients)")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        results["sqlite"] = await run_backend(f"sqlite:///{tmp}/work.db", args.nodes, args.each)
    if await postgres_reachable():
        async with postgres_database("work") as url:
            results["postgresql"] = await run_backend(url, args.nodes, args.each)
    goals = []
    for backend, r in results.items():
        goals += [
            Goal(f"{backend}: bytecodes per 32-client create", str(r["create_bytecodes"]),
                 f"{r['create_bytecodes'] / r['bare_commit_bytecodes']:.2f}x a bare commit",
                 "(reported)", True),
            Goal(f"{backend}: bytecodes per preview", str(r["preview_bytecodes"]),
                 f"{r['preview_bytecodes'] / r['rollup_read_bytecodes']:.2f}x a rollup read",
                 "(reported)", True),
            Goal(f"{backend}: SQL statements per commit group of {r['batch_mean']:g}",
                 str(r["statements_per_batch"]), "", "(reported)", True),
            Goal(f"{backend}: collector-tracked objects kept per create",
                 str(r["tracked_objects_per_create"]), "", "(reported)", True),
        ]  # fmt: skip
    return write("booking_work", results, goals)


if __name__ == "__main__":
    sys.exit(uvloop.run(main()))
