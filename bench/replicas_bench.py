"""Read throughput with one and with two coordinator replicas on one PostgreSQL ledger
(SPEC §7: followers serve reads from their own snapshot). Each replica is its own
process (`python -m coordinator.main`); a fleet of 1,000 8-GPU nodes, half booked, is
written first. Concurrent clients then send a mix of reads — capacity.preview,
capacity.byPool, capacity.summary, capacity.timeline, reservations.list, a nodes.list
page — spread over the replicas, for a fixed time; reads per second are counted, and
every answer must be a 200.

Baseline from the same run: the same load against one replica. On a machine with few
cores the client and the replicas share them, so the ratio says how far a second
replica helps there, not what it gives on dedicated hosts.

    .venv/bin/python bench/replicas_bench.py [--nodes 1000] [--seconds 10] [--clients 32]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import sys
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fleet import postgres_database, postgres_reachable
from placement_bench import fleet
from report import Goal, write

from ops.kit.embedded_nats import EmbeddedNats
from ops.kit.keys import new_key

ROOT = Path(__file__).resolve().parent.parent


@asynccontextmanager
async def replica(db: str, nats_url: str, key: str) -> AsyncIterator[str]:
    """One coordinator process; yields its base URL once it listens."""
    env = {
        **os.environ,
        "GPUFLEET_DATABASE_URL": db,
        "GPUFLEET_NATS_URL": nats_url,
        "GPUFLEET_HTTP_PORT": "0",
        "GPUFLEET_SUBJECT_PREFIX": "rep",
        "GPUFLEET_BOOTSTRAP_OPERATOR_KEY": key,
        "GPUFLEET_INSECURE_BUS": "true",  # the embedded server has no users
        "GPUFLEET_LOG_LEVEL": "WARNING",
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "coordinator.main", cwd=ROOT, env=env,
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 120)).decode()
        if "listening on " not in line:
            raise RuntimeError(f"coordinator did not start: {line!r}")
        yield line.rsplit("listening on ", 1)[1].strip()
    finally:
        proc.terminate()
        await proc.wait()


def mix(pool: str) -> list[tuple[str, dict[str, Any]]]:
    bench = {"tenantId": "bench"}
    gpus = {
        "poolId": pool,
        "devices": [{"class": "gpu", "count": 2}],
        "duration": "1h",
        "idempotencyKey": "try",
    }
    return [
        ("capacity/preview", bench | gpus),
        ("capacity/byPool", bench | {"poolId": pool}),
        ("capacity/summary", bench),
        ("capacity/preview", bench | gpus | {"devices": [{"class": "gpu", "count": 4}]}),
        ("capacity/timeline", bench | {"poolId": pool}),
        ("reservations/list", bench | {"limit": 20}),
        ("nodes/list", bench | {"poolId": pool, "limit": 100}),
    ]


async def load(urls: list[str], key: str, pool: str, clients: int, seconds: float) -> float:
    """Reads per second from `clients` concurrent clients, spread over `urls`."""
    calls = mix(pool)
    done = 0
    headers = {"Authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession(headers=headers) as http:

        async def client(c: int) -> None:
            nonlocal done
            base = urls[c % len(urls)]
            for method, body in itertools.cycle(calls[c % len(calls) :] + calls[: c % len(calls)]):
                if time.perf_counter() >= stop:
                    return
                async with http.post(f"{base}/api/compute/{method}", json=body) as response:
                    await response.read()
                    if response.status != 200:
                        raise RuntimeError(f"{method}: {response.status}")
                done += 1

        stop = time.perf_counter() + 1.0  # warm every replica's snapshot and pool
        await asyncio.gather(*(client(c) for c in range(clients)))
        done = 0
        t0 = time.perf_counter()
        stop = t0 + seconds
        await asyncio.gather(*(client(c) for c in range(clients)))
        return done / (time.perf_counter() - t0)


async def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--clients", type=int, default=32)
    a = p.parse_args()
    if not await postgres_reachable():
        print("replicas: PostgreSQL not reachable, nothing measured")
        goal = Goal("postgresql: replicas", "not run", "", "(needs PostgreSQL)", True)
        return write("replicas", {}, [goal])
    key = new_key()
    with EmbeddedNats() as server:
        async with postgres_database("replicas") as db:
            async with fleet(db, a.nodes) as (_, pool, _):
                pass  # the fleet stays in the ledger
            async with AsyncExitStack() as stack:
                first = await stack.enter_async_context(replica(db, server.url, key))
                one = await load([first], key, pool, a.clients, a.seconds)
                second = await stack.enter_async_context(replica(db, server.url, key))
                two = await load([first, second], key, pool, a.clients, a.seconds)
    cores = os.cpu_count() or 1
    results = {
        "nodes": a.nodes, "clients": a.clients, "seconds": a.seconds, "cores": cores,
        "reads_per_s_one_replica": round(one, 1), "reads_per_s_two_replicas": round(two, 1),
        "two_over_one": round(two / one, 2),
    }  # fmt: skip
    print(f"reads/s: one replica {one:.0f}, two {two:.0f} ({two / one:.2f}x); {cores} cores")
    goals = [
        Goal("postgresql: reads, one replica", f"{one:.0f}/s", "", "(baseline)", True),
        Goal(
            "postgresql: reads, two replicas (leader + follower)", f"{two:.0f}/s",
            f"{two / one:.2f}x one replica", "(reported)", True,
        ),
    ]  # fmt: skip
    return write("replicas", results, goals)


if __name__ == "__main__":
    sys.exit(uvloop.run(main()))
