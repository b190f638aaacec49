"""Heartbeat ingest benchmark (SPEC §8): heartbeats through a real nats-server into one
coordinator, against a baseline measured in the same run — a bare nats-py subscriber
that only counts messages.

Goals: at least 30,000 heartbeats/s, p99 lag under 1 s at 30,000/s, and at least half
the baseline's rate. Prints a table, writes bench/results/ingest.json.

    .venv/bin/python bench/ingest_bench.py [--count 200000] [--nodes 2000] [--asyncio]

Both the baseline and the coordinator run on uvloop, as `gpufleet-coordinator` does;
`--asyncio` measures both on the standard loop instead.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import nats

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from coordinator.app import running_coordinator
from coordinator.config import CoordinatorSettings
from ops.cli import new_key
from ops.embedded_nats import EmbeddedNats
from shared.ids import new_pool_id
from shared.wire import Heartbeat, Inventory, NodeHealth

HERE = Path(__file__).resolve().parent
PREFIX = "bench"


def publish(
    url: str, pool: str, nodes: int, count: int, rate: float = 0
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            str(HERE / "publisher.py"),
            url,
            PREFIX,
            pool,
            str(nodes),
            str(count),
            str(rate),
        ]
    )


class Counter:
    def __init__(self, expect: int) -> None:
        self.expect = expect
        self.n = 0
        self.first = 0.0
        self.last = 0.0
        self.done = asyncio.Event()
        self.lags: list[float] = []

    def hit(self, lag_ms: float | None = None) -> None:
        now = time.perf_counter()
        if self.n == 0:
            self.first = now
        self.n += 1
        self.last = now
        if lag_ms is not None:
            self.lags.append(lag_ms)
        if self.n >= self.expect:
            self.done.set()

    @property
    def rate(self) -> float:
        return (self.n - 1) / (self.last - self.first) if self.n > 1 else 0.0


async def baseline(url: str, pool: str, nodes: int, count: int) -> float:
    nc = await nats.connect(url)
    counter = Counter(count)

    async def on(_msg: Any) -> None:
        counter.hit()

    await nc.subscribe(f"{PREFIX}.hb.>", cb=on, pending_msgs_limit=1_000_000)
    await nc.flush()
    proc = publish(url, pool, nodes, count)
    await asyncio.wait_for(counter.done.wait(), timeout=300)
    proc.wait()
    await nc.close()
    return counter.rate


async def coordinator_run(
    url: str, pool_id: str, nodes: int, count: int, rate: float
) -> tuple[float, list[float], dict[str, int]]:
    with tempfile.TemporaryDirectory() as tmp:
        settings = CoordinatorSettings(
            database_url=f"sqlite:///{tmp}/bench.db", nats_url=url, http_port=0,
            subject_prefix=PREFIX, bootstrap_operator_key=new_key(), insecure_bus=True,
            # Throughput, not fairness: each node here sends far beyond a real agent.
            ingest_node_rate=10_000, ingest_node_burst=1_000_000,
        )  # fmt: skip
        async with running_coordinator(settings) as c:
            await c.ledger.tenants.create("bench", "bench", 1)
            await c.ledger.pools.create(pool_id, "bench", "bench", None, 1)
            for i in range(nodes):
                inv = Inventory(
                    node_id=f"node-{i:05d}", pool_id=pool_id, boot_id="b", sent_at=0,
                    inventory_hash=f"hash-{i:05d}", health=NodeHealth(status="healthy"),
                )  # fmt: skip
                c.ingest.sink.on_inventory(inv)
            while len(c.tracker.nodes) < nodes:  # noqa: ASYNC110 - the writer loop fills it
                await asyncio.sleep(0.1)
            counter = Counter(count)
            sink = c.ingest.sink
            original = sink.on_heartbeat

            def measured(hb: Heartbeat) -> None:
                original(hb)
                counter.hit(time.time() * 1000 - hb.sent_at)

            sink.on_heartbeat = measured  # type: ignore[method-assign]
            proc = publish(url, pool_id, nodes, count, rate)
            await asyncio.wait_for(counter.done.wait(), timeout=300)
            proc.wait()
            dropped = dict(c.ingest.dropped)
            return counter.rate, counter.lags, dropped


def pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=200_000)
    parser.add_argument("--nodes", type=int, default=2_000)
    parser.add_argument("--rate", type=float, default=30_000, help="paced run for lag")
    args = parser.parse_args()
    with EmbeddedNats() as server:
        pool = new_pool_id()
        base = await baseline(server.url, pool, args.nodes, args.count)
        blast, _, dropped = await coordinator_run(server.url, pool, args.nodes, args.count, 0)
        paced_count = int(args.rate * 5)
        paced, lags, _ = await coordinator_run(
            server.url, new_pool_id(), args.nodes, paced_count, args.rate
        )
    result = {
        "baseline_msgs_per_s": round(base),
        "coordinator_hb_per_s": round(blast),
        "ratio_to_baseline": round(blast / base, 3) if base else None,
        "paced_rate": args.rate,
        "paced_achieved_per_s": round(paced),
        "lag_ms_p50": round(statistics.median(lags), 1) if lags else None,
        "lag_ms_p99": round(pct(lags, 0.99), 1),
        "dropped": dropped,
        "goals": {
            "hb_per_s>=30000": blast >= 30_000,
            "ratio>=0.5": bool(base) and blast / base >= 0.5,
            "lag_p99<1000ms": pct(lags, 0.99) < 1000,
        },
        "count": args.count,
        "nodes": args.nodes,
    }
    rows = [
        ("bare nats-py subscriber (baseline)", f"{base:,.0f} msg/s", "1.00"),
        ("coordinator ingest, max rate", f"{blast:,.0f} hb/s", f"{result['ratio_to_baseline']}"),
        (
            f"coordinator at {args.rate:,.0f}/s: lag p50 / p99",
            f"{result['lag_ms_p50']} / {result['lag_ms_p99']} ms",
            "",
        ),
    ]
    print(f"{'measure':<45} {'value':>22} {'ratio':>7}")
    for name, value, ratio in rows:
        print(f"{name:<45} {value:>22} {ratio:>7}")
    for goal, met in result["goals"].items():  # type: ignore[union-attr]
        print(f"  goal {goal}: {'met' if met else 'MISSED'}")
    out = HERE / "results" / "ingest.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    # The same event loop the coordinator runs on (coordinator/main.py), for both sides.
    if "--asyncio" in sys.argv:
        sys.argv.remove("--asyncio")
        sys.exit(asyncio.run(main()))
    import uvloop

    sys.exit(uvloop.run(main()))
