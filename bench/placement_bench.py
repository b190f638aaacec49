"""Placement and booking benchmark (SPEC §8): capacity.preview latency at 1,000 nodes /
8,000 GPUs half booked (and how its p99 grows at larger fleets), reservations.create
commits per second through the reservation workflow (idempotency record, quota, rollup:
what the API runs) sequentially and with 8 and 32 concurrent clients, and a
double-booking check, and creates refused on every node (each explained from what the
nodes have free) — on SQLite and, when reachable, PostgreSQL.

Baselines from the same run: reading one pool's rollup rows (one indexed query) for the
preview latency, and a bare one-row write transaction for the commit rate — each
measured in turns with what it is the baseline of (a read after each preview; bare
commits between rounds of 32-client creates), so a shared machine's shifting load moves
both alike.
Prints a table, writes bench/results/placement.json and bench/scaling.png (the curves).

    .venv/bin/python bench/placement_bench.py [--nodes 1000] [--scale 5000,10000]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import uvloop
from sqlalchemy import select

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fleet import inventory, postgres_database, postgres_reachable
from report import Goal, write

from coordinator.api.http.context import Services
from coordinator.config import CoordinatorSettings
from coordinator.domain.placement_model import DeviceRequest, PlacementRequest
from coordinator.ledger import Ledger, schema
from coordinator.runtime.heap import HeapGenerations
from coordinator.services.node_records import record_inventories
from coordinator.services.reservations import Created, CreateRequest
from shared.clock import SystemClock
from shared.ids import new_pool_id

HERE = Path(__file__).resolve().parent
HOUR = 3_600_000
CLIENTS = (1, 8, 32)
HEAP_REFRESH_S = CoordinatorSettings().heap_refresh_s


def request(
    pool: str, key: str, count: int, start: int | None, minutes: int, gang: int = 1
) -> CreateRequest:
    return CreateRequest(
        tenant_id="bench", pool_id=pool, project_id=None,
        placement=PlacementRequest(devices=(DeviceRequest("gpu", count),), gang_size=gang),
        start=start, duration_ms=minutes * 60_000, lease_seconds=None, resources={},
        gang=None, idempotency_key=key, canonical={"key": key},
    )  # fmt: skip


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@asynccontextmanager
async def fleet(url: str, nodes: int) -> AsyncIterator[tuple[Services, str, int]]:
    """A ledger with `nodes` 8-GPU nodes in one pool, half of every node's GPUs booked,
    its heap kept as the coordinator keeps it (`runtime.heap`, the default interval)."""
    ledger = await Ledger.open(url, heap=HeapGenerations(int(HEAP_REFRESH_S * 1000)))
    try:
        services = Services(ledger, SystemClock())
        now = services.clock.now_ms()
        await ledger.tenants.create("bench", "bench", now)
        pool = new_pool_id()
        await ledger.pools.create(pool, "bench", "bench", None, now)
        # Inventories made 500 at a time and dropped once recorded: kept, ~12,000 wire
        # objects (1,000 nodes) stayed on the heap that every full collector pass walks,
        # a cost of the bench, not of the coordinator.
        for i in range(0, nodes, 500):
            chunk = range(i, min(nodes, i + 500))
            await record_inventories(ledger, [inventory(n, pool) for n in chunk], now)
        # Half the GPUs booked until later than anything measured: 4 on every node, by
        # gangs of 25 nodes (a setup, not a measure).
        per = 25
        for i in range(0, nodes, per):
            out = await services.reservations.create(
                request(pool, f"half-{i}", 4, None, 600, gang=min(per, nodes - i))
            )
            assert isinstance(out, Created), out
        yield services, pool, now
    finally:
        await ledger.close()


async def previews(services: Services, pool: str, now: int, n: int) -> list[float]:
    req = PlacementRequest(devices=(DeviceRequest("gpu", 2),))
    lat = []
    for _ in range(n):
        t0 = time.perf_counter()
        placement = (
            await services.ledger.bookings.preview(pool, req, now, now + HOUR, now, 120_000)
        ).placement
        lat.append((time.perf_counter() - t0) * 1000)
        assert placement.fits
    return lat


class GcPauses:
    """Python's cyclic collector while installed: how many passes of each generation
    ran and how long the process stood still for them (the event loop included)."""

    def __init__(self) -> None:
        self._t0 = 0.0
        self.passes = [0, 0, 0]
        self.ms = [0.0, 0.0, 0.0]

    def _observe(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
            return
        self.passes[info["generation"]] += 1
        self.ms[info["generation"]] += (time.perf_counter() - self._t0) * 1000

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self._observe)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._observe)


async def creates(
    services: Services, pool: str, now: int, clients: int, each: int, count: int = 0
) -> dict[str, float]:
    """Commits per second of `clients` concurrent clients, `each` requests each, for
    overlapping future windows (some refused: refusals are recorded commits too; `count`
    GPUs each if given, else 1 to 3); the
    mean size of the commit groups they formed (issue 23: 8 clients no faster than one
    would show here as groups smaller than 8) and the collector's pauses meanwhile (a
    full pass over a large heap inside a run of 64 requests would show here)."""
    tag = f"{clients}-{time.perf_counter_ns()}"
    refused = 0

    async def client(c: int) -> None:
        nonlocal refused
        for r in range(each):
            start = now + 3 * HOUR + (c + r) % 6 * 600_000
            out = await services.reservations.create(
                request(pool, f"c{tag}-{c}-{r}", count or 1 + (c + r) % 3, start, 30)
            )
            refused += not isinstance(out, Created)

    batches = services.reservations.batches_run
    with GcPauses() as pauses:
        t0 = time.perf_counter()
        await asyncio.gather(*(client(c) for c in range(clients)))
        seconds = time.perf_counter() - t0
    return {
        "per_s": clients * each / seconds,
        "batch_mean": clients * each / max(1, services.reservations.batches_run - batches),
        "gc_full_passes": pauses.passes[2],
        "gc_ms": round(sum(pauses.ms), 1),
        "refused": refused,
    }


async def double_bookings(ledger: Ledger) -> int:
    async with ledger.database.read() as conn:
        rows = (await conn.execute(select(schema.bookings))).all()
    spans: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for row in rows:
        spans[row.atom_id].append((row.start, row.end))
    return sum(
        1
        for s in spans.values()
        for (_, end), (start, _) in itertools.pairwise(sorted(s))
        if start < end
    )


async def bare_commits(ledger: Ledger, now: int, n: int = 200) -> float:
    t0 = time.perf_counter()
    for i in range(n):
        async with ledger.database.transaction() as conn:
            await conn.execute(
                schema.idempotency.insert().values(
                    tenant_id="bench", endpoint="bare", key=f"{now}-{i}", body_hash="x",
                    status=200, response={}, created_at=now,
                )
            )  # fmt: skip
    return n / (time.perf_counter() - t0)


async def previews_and_reads(
    services: Services, pool: str, now: int, n: int
) -> tuple[list[float], list[float]]:
    """Preview latencies and rollup-read latencies (ms), one of each in turn, so that
    both see the same machine: on a shared one the load moves within seconds."""
    req = PlacementRequest(devices=(DeviceRequest("gpu", 2),))
    lat, base = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        preview = await services.ledger.bookings.preview(pool, req, now, now + HOUR, now, 120_000)
        t1 = time.perf_counter()
        await services.ledger.rollup([pool])
        t2 = time.perf_counter()
        assert preview.placement.fits
        lat.append((t1 - t0) * 1000)
        base.append((t2 - t1) * 1000)
    return lat, base


async def creates_and_bare(
    services: Services, pool: str, now: int, clients: int, each: int, rounds: int = 4
) -> tuple[dict[str, float], float]:
    """`creates` with `clients` clients and bare commits (per s), in `rounds` turns of
    each, so that the ratio of the two is measured under the same load."""
    per_round = max(1, each // rounds)
    seconds = bare_seconds = 0.0
    done = bare_done = batches = gc_full = 0
    gc_ms = 0.0
    for k in range(rounds):
        t0 = time.perf_counter()
        await bare_commits(services.ledger, now + k + 1, 25)
        bare_seconds += time.perf_counter() - t0
        bare_done += 25
        run = await creates(services, pool, now, clients, per_round)
        seconds += clients * per_round / run["per_s"]
        done += clients * per_round
        batches += round(clients * per_round / run["batch_mean"])
        gc_full += int(run["gc_full_passes"])
        gc_ms += run["gc_ms"]
    return (
        {
            "per_s": done / seconds,
            "batch_mean": done / max(1, batches),
            "gc_full_passes": gc_full,
            "gc_ms": round(gc_ms, 1),
        },
        bare_done / bare_seconds,
    )


async def run_backend(url: str, nodes: int, n_previews: int, each: int) -> dict[str, Any]:
    async with fleet(url, nodes) as (services, pool, now):
        lat, base = await previews_and_reads(services, pool, now, n_previews)
        # At least 256 requests per client count (`each` per client with 32 clients): a
        # run of 64 (8 clients x 8, as before issue 23) lasted 0.1-0.7 s, so one stall
        # of the process on a shared machine halved it, or doubled the one-client rate.
        runs = {
            c: await creates(services, pool, now, c, max(each, 32 * each // c))
            for c in CLIENTS
            if c != 32
        }
        # The 32-client rate against bare commits measured in turns with it (issue 30).
        runs[32], bare = await creates_and_bare(services, pool, now, 32, each)
        rates = {c: run["per_s"] for c, run in runs.items()}
        # Refusals where every node is short (9 GPUs asked of 8-GPU nodes): each is
        # explained from what the nodes have free, every node of the pool counted out.
        short = await creates(services, pool, now, 32, each, count=9)
        assert short["refused"] == 32 * each, short
        # What a full collector pass walks (tracked, not frozen) and what it skips.
        walked, frozen = len(gc.get_objects()), gc.get_freeze_count()
        doubles = await double_bookings(services.ledger)
    return {
        "nodes": nodes,
        "gpus": nodes * 8,
        "preview_ms_p50": round(pct(lat, 0.5), 2),
        "preview_ms_p99": round(pct(lat, 0.99), 2),
        "rollup_read_ms_p50": round(pct(base, 0.5), 3),
        "preview_p99_over_rollup_read": round(pct(lat, 0.99) / pct(base, 0.5), 1),
        "bare_commits_per_s": round(bare, 1),
        "create_per_s": {str(c): round(r, 1) for c, r in rates.items()},
        "create_batch_mean": {str(c): round(run["batch_mean"], 1) for c, run in runs.items()},
        "create_gc_ms": {str(c): run["gc_ms"] for c, run in runs.items()},
        "create_gc_full_passes": {str(c): run["gc_full_passes"] for c, run in runs.items()},
        "create_32_over_bare": round(rates[32] / bare, 2),
        "refused_32_per_s": round(short["per_s"], 1),
        "refused_32_over_bare": round(short["per_s"] / bare, 2),
        "gc_walked_objects": walked,
        "gc_frozen_objects": frozen,
        "double_bookings": doubles,
    }


async def preview_at(url: str, nodes: int, n_previews: int) -> dict[str, float]:
    async with fleet(url, nodes) as (services, pool, now):
        lat = await previews(services, pool, now, n_previews)
    return {"preview_ms_p50": round(pct(lat, 0.5), 2), "preview_ms_p99": round(pct(lat, 0.99), 2)}


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for backend, r in results.items():
        sizes = sorted(int(k) for k in r["preview_by_nodes"])
        left.plot(sizes, [r["preview_by_nodes"][str(n)]["preview_ms_p99"] for n in sizes],
                  marker="o", label=backend)  # fmt: skip
        right.plot(list(CLIENTS), [r["create_per_s"][str(c)] for c in CLIENTS], marker="o",
                   label=backend)  # fmt: skip
    left.axhline(10, color="grey", linestyle="--", label="goal (1,000 nodes)")
    left.set(title="capacity.preview p99", xlabel="nodes (8 GPUs each, half booked)", ylabel="ms")
    right.axhline(500, color="grey", linestyle="--", label="goal")
    right.set(title="reservations.create", xlabel="concurrent clients", ylabel="commits/s")
    for ax in (left, right):
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"wrote {path}")


async def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--scale", default="5000,10000", help="more fleet sizes for preview")
    parser.add_argument("--previews", type=int, default=300)
    parser.add_argument(
        "--each",
        type=int,
        default=8,
        help="requests per client with 32 clients (the others: as many in all)",
    )
    parser.add_argument("--sqlite", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()
    sizes = [int(x) for x in args.scale.split(",") if x]
    backends: list[tuple[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        if args.sqlite:
            backends.append(("sqlite", lambda tag: _sqlite(tmp, tag)))
        if await postgres_reachable():
            backends.append(("postgresql", lambda tag: postgres_database(tag)))
        results: dict[str, Any] = {}
        for backend, database in backends:
            async with database("main") as url:
                r = results[backend] = await run_backend(url, args.nodes, args.previews, args.each)
            r["preview_by_nodes"] = {
                str(args.nodes): {k: r[k] for k in ("preview_ms_p50", "preview_ms_p99")}
            }
            for size in sizes:
                async with database(f"n{size}") as url:
                    r["preview_by_nodes"][str(size)] = await preview_at(url, size, args.previews)
    goals = []
    for backend, r in results.items():
        growth = ", ".join(
            f"{int(n):,}: {v['preview_ms_p99']} ms" for n, v in r["preview_by_nodes"].items()
        )
        print(f"{backend}: preview p99 by fleet size: {growth}")
        print(f"{backend}: reservations.create per s by clients: {r['create_per_s']}")
        print(
            f"{backend}: commit group mean size {r['create_batch_mean']}, collector pauses"
            f" (ms) {r['create_gc_ms']}, full passes {r['create_gc_full_passes']}; a full"
            f" pass walks {r['gc_walked_objects']:,} objects, {r['gc_frozen_objects']:,} frozen"
        )
        goals += [
            Goal(
                f"{backend}: capacity.preview p99, {args.nodes:,} nodes half booked",
                f"{r['preview_ms_p99']} ms", f"{r['preview_p99_over_rollup_read']}x a rollup read",
                "<= 10 ms", r["preview_ms_p99"] <= 10,
            ),
            # Issue 30: the same figures as ratios to their baselines from this run.
            Goal(
                f"{backend}: capacity.preview p99 over a rollup read, {args.nodes:,} nodes",
                f"{r['preview_ms_p99']} ms; read {r['rollup_read_ms_p50']} ms",
                f"{r['preview_p99_over_rollup_read']}x a rollup read", "<= 3x a rollup read",
                r["preview_p99_over_rollup_read"] <= 3,
            ),
            Goal(
                f"{backend}: reservations.create, 32 clients",
                f"{r['create_per_s']['32']}/s", f"{r['create_32_over_bare']}x a bare commit",
                ">= 500/s", r["create_per_s"]["32"] >= 500,
            ),
            Goal(
                f"{backend}: reservations.create, 32 clients over a bare commit",
                f"{r['create_per_s']['32']}/s; bare {r['bare_commits_per_s']}/s",
                f"{r['create_32_over_bare']}x a bare commit", ">= 2x a bare commit",
                r["create_32_over_bare"] >= 2,
            ),
            Goal(
                f"{backend}: reservations.create, 8 clients",
                f"{r['create_per_s']['8']}/s",
                f"{r['create_per_s']['8'] / r['create_per_s']['1']:.2f}x one client",
                ">= 2x one client", r["create_per_s"]["8"] >= 2 * r["create_per_s"]["1"],
            ),
            Goal(
                f"{backend}: reservations.create, sequential", f"{r['create_per_s']['1']}/s",
                f"{r['create_per_s']['1'] / r['bare_commits_per_s']:.2f}x a bare commit",
                "(reported)", True,
            ),
            Goal(
                f"{backend}: reservations.create refused on every node, 32 clients",
                f"{r['refused_32_per_s']}/s", f"{r['refused_32_over_bare']}x a bare commit",
                ">= 1x a bare commit", r["refused_32_over_bare"] >= 1,
            ),
            Goal(f"{backend}: double bookings", str(r["double_bookings"]), "", "0",
                 r["double_bookings"] == 0),
        ]  # fmt: skip
    plot(results, HERE / "scaling.png")
    return write("placement", results, goals)


@asynccontextmanager
async def _sqlite(tmp: str, tag: str) -> AsyncIterator[str]:
    yield f"sqlite:///{tmp}/{tag}.db"


if __name__ == "__main__":
    sys.exit(uvloop.run(main()))
