"""Placement and booking benchmark (SPEC §8): capacity.preview latency at 1,000 nodes /
8,000 GPUs half booked, reservations.create commits per second, and 32 concurrent
clients with a double-booking check — on SQLite and, when reachable, PostgreSQL.

Baselines from the same run: reading one pool's rollup rows (one indexed query) for the
preview latency, and a bare one-row write transaction for the commit rate.
Prints a table and writes bench/results/placement.json.

    .venv/bin/python bench/placement_bench.py [--nodes 1000] [--previews 300]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from coordinator.services.node_changes import record_inventory

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import select

from coordinator.domain.placement import DeviceRequest, PlacementRequest
from coordinator.ledger import Ledger, schema
from coordinator.ledger.bookings import Booked, BookingRequest
from shared.ids import new_pool_id
from shared.wire import Atom, Inventory, NodeHealth, Scalars

HERE = Path(__file__).resolve().parent
PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/test"
HOUR = 3_600_000


def inventory(i: int, pool: str) -> Inventory:
    node = f"node-{i:04d}"
    atoms = [Atom(atom_id=f"{node}:node", cls="node")]
    atoms += [
        Atom(
            atom_id=f"{node}:gpu:{g}",
            cls="gpu",
            device_id=f"GPU-{i}-{g}",
            attrs={"model": "H100", "nvlinkClique": "nvl0"},
        )
        for g in range(8)
    ]
    return Inventory(
        node_id=node, pool_id=pool, boot_id="b", sent_at=0, inventory_hash=str(i),
        labels={"rack": f"r{i // 32}"}, scalars=Scalars(vcpu=128, memoryGiB=1024),
        atoms=tuple(atoms), health=NodeHealth(status="healthy"),
    )  # fmt: skip


def booking(pool: str, key: str, count: int, start: int, minutes: int) -> BookingRequest:
    return BookingRequest(
        tenant_id="bench", pool_id=pool, project_id=None,
        placement=PlacementRequest(devices=(DeviceRequest("gpu", count),)),
        start=start, duration_ms=minutes * 60_000, lease_seconds=None, resources={},
        gang=None, idempotency_key=key, digest=key, notice_ms=120_000,
    )  # fmt: skip


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run_backend(url: str, nodes: int, previews: int) -> dict[str, Any]:
    ledger = await Ledger.open(url)
    try:
        now = int(time.time() * 1000)
        await ledger.tenants.create("bench", "bench", now)
        pool = new_pool_id()
        await ledger.pools.create(pool, "bench", "bench", None, now)
        for i in range(nodes):
            await record_inventory(ledger, inventory(i, pool), now)

        # Half the GPUs booked: 4 on every node, sequentially, timed.
        t0 = time.perf_counter()
        for i in range(nodes):
            out = await ledger.bookings.create(booking(pool, f"half-{i}", 4, now, 120), now)
            assert isinstance(out, Booked), out
        create_rate = nodes / (time.perf_counter() - t0)

        # Baseline for commits: a bare one-row write transaction.
        t0 = time.perf_counter()
        for i in range(200):
            async with ledger.db.transaction() as conn:
                await conn.execute(
                    schema.idempotency.insert().values(
                        tenant_id="bench", endpoint="bare", key=str(i), body_hash="x",
                        status=200, response={}, created_at=now,
                    )
                )  # fmt: skip
        bare_rate = 200 / (time.perf_counter() - t0)

        # Preview latency against the half-booked fleet, and its baseline.
        req = PlacementRequest(devices=(DeviceRequest("gpu", 2),))
        lat = []
        for _ in range(previews):
            t0 = time.perf_counter()
            placement, _ = await ledger.bookings.preview(pool, req, now, now + HOUR, now, 120_000)
            lat.append((time.perf_counter() - t0) * 1000)
            assert placement.fits
        base = []
        for _ in range(previews):
            t0 = time.perf_counter()
            await ledger.rollup([pool])
            base.append((time.perf_counter() - t0) * 1000)

        # 32 concurrent clients booking overlapping future windows.
        async def client(c: int) -> int:
            booked = 0
            for r in range(8):
                start = now + 3 * HOUR + (c + r) % 6 * 600_000
                req = booking(pool, f"c{c}-{r}", 1 + (c + r) % 3, start, 30)
                if isinstance(await ledger.bookings.create(req, now), Booked):
                    booked += 1
            return booked

        t0 = time.perf_counter()
        booked = sum(await asyncio.gather(*(client(c) for c in range(32))))
        concurrent_rate = 32 * 8 / (time.perf_counter() - t0)
        async with ledger.db.read() as conn:
            rows = (await conn.execute(select(schema.bookings))).all()
        spans: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for row in rows:
            spans[row.atom_id].append((row.start, row.end))
        doubles = sum(
            1
            for s in spans.values()
            for (_, end), (start, _) in itertools.pairwise(sorted(s))
            if start < end
        )
        return {
            "nodes": nodes,
            "gpus": nodes * 8,
            "create_commits_per_s": round(create_rate, 1),
            "bare_commits_per_s": round(bare_rate, 1),
            "create_ratio_to_bare": round(create_rate / bare_rate, 3),
            "preview_ms_p50": round(pct(lat, 0.5), 2),
            "preview_ms_p99": round(pct(lat, 0.99), 2),
            "rollup_read_ms_p50": round(pct(base, 0.5), 3),
            "preview_p99_over_rollup_read": round(pct(lat, 0.99) / pct(base, 0.5), 1),
            "concurrent_requests_per_s": round(concurrent_rate, 1),
            "concurrent_booked": booked,
            "double_bookings": doubles,
            "goals": {
                "preview_p99<=10ms": pct(lat, 0.99) <= 10,
                "create>=500/s": create_rate >= 500,
                "zero_double_bookings": doubles == 0,
            },
        }
    finally:
        await ledger.close()


async def postgres_url() -> str | None:
    try:
        import asyncpg

        conn = await asyncio.wait_for(asyncpg.connect(PG_ADMIN), timeout=3)
    except Exception:
        return None
    name = f"gpufleet_bench_{int(time.time())}"
    await conn.execute(f"CREATE DATABASE {name}")
    await conn.close()
    return PG_ADMIN.rsplit("/", 1)[0] + "/" + name


async def drop_postgres(url: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(PG_ADMIN)
    await conn.execute(f"DROP DATABASE IF EXISTS {url.rsplit('/', 1)[1]} WITH (FORCE)")
    await conn.close()


async def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--previews", type=int, default=300)
    args = parser.parse_args()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        results["sqlite"] = await run_backend(f"sqlite:///{tmp}/b.db", args.nodes, args.previews)
    pg = await postgres_url()
    if pg:
        try:
            results["postgresql"] = await run_backend(pg, args.nodes, args.previews)
        finally:
            await drop_postgres(pg)
    keys = [
        "create_commits_per_s", "bare_commits_per_s", "create_ratio_to_bare",
        "preview_ms_p50", "preview_ms_p99", "rollup_read_ms_p50",
        "preview_p99_over_rollup_read", "concurrent_requests_per_s", "double_bookings",
    ]  # fmt: skip
    print(f"{'measure':<32}" + "".join(f"{b:>14}" for b in results))
    for key in keys:
        print(f"{key:<32}" + "".join(f"{results[b][key]:>14}" for b in results))
    for backend, data in results.items():
        for goal, met in data["goals"].items():
            print(f"  {backend} goal {goal}: {'met' if met else 'MISSED'}")
    out = HERE / "results" / "placement.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
