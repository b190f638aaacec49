"""Heartbeat ingest benchmark (SPEC §8): heartbeats through a real nats-server into one
coordinator, against a baseline measured in the same run — a bare nats-py subscriber
that only counts messages.

Goals: at least 30,000 heartbeats/s, p99 lag under 1 s at 30,000/s, and every heartbeat
of the blast either processed or counted as dropped by the coordinator (a run that loses
some reports how many instead of waiting for them). The ratio to the baseline is
reported, not a goal (SPEC §8: the coordinator reads through nats-py's public API, whose
per-message cost the bare subscriber pays too). Prints a table, writes
bench/results/ingest.json.

    .venv/bin/python bench/ingest_bench.py [--count 200000] [--nodes 2000] [--asyncio]

The baseline runs before and after the coordinator's blast; the ratio is against the
mean of the two (the machine's load drifts during a run). Both the baseline and the
coordinator run on uvloop, as `gpufleet-coordinator` does;
`--asyncio` measures both on the standard loop instead.

A third run blasts `--starved-count` heartbeats while every core is busy (a CPU hog,
one spinning process per core, that the benchmark starts and stops itself): a starved
coordinator may be slow, but must still account for every message (issue 32: with the
cores busy, heartbeats were lost uncounted when the coordinator's link probe took its
late answer for a dead link and reconnected, dropping what the server held for it).
Every run reports processed + counted drops against what the publisher sent.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from report import Goal, write

from coordinator.app import running_coordinator
from coordinator.config import CoordinatorSettings
from ops.kit.embedded_nats import EmbeddedNats
from ops.kit.keys import new_key
from procs.nats import ProbedNatsSettings
from shared.ids import new_pool_id
from shared.wire import Atom, Heartbeat, Inventory, NodeHealth

HERE = Path(__file__).resolve().parent
PREFIX = "bench"
# How long the final round trip to the server may take (a starved run's backlog).
FINAL_FLUSH_S = 300


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


@contextlib.contextmanager
def cpu_hog(processes: int | None = None) -> Iterator[None]:
    """Every core busy while inside: one spinning process per core, stopped (by their
    own ids) on the way out."""
    spinners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(processes or os.cpu_count() or 1)
    ]
    try:
        yield
    finally:
        for p in spinners:
            p.kill()
        for p in spinners:
            p.wait()


class Progress:
    """Counts a run by polling: when the count first moved, when it last moved, and
    whether it has settled (nothing moved for `quiet_s`). Polling instead of a timestamp
    per message keeps the measuring out of the hot path it measures."""

    def __init__(self, expect: int, quiet_s: float = 5.0) -> None:
        self.expect = expect
        self.quiet_s = quiet_s
        self.n = 0
        self.first = self.last = 0.0
        self.publisher_gone: float | None = None

    async def settle(
        self,
        count: Callable[[], int],
        accounted: Callable[[], int],
        publisher: subprocess.Popen[bytes],
    ) -> None:
        """Until every message is accounted for (processed or counted as dropped), or
        nothing has moved for `quiet_s` since the publisher exited (the rest was lost
        without being counted). While the publisher runs, a quiet spell is its own (a
        starved process on a loaded machine), not a loss."""
        moved = time.perf_counter()
        while True:
            await asyncio.sleep(0.02)
            now, n = time.perf_counter(), count()
            if n != self.n:
                if self.n == 0:
                    self.first = now
                self.n, self.last, moved = n, now, now
            if accounted() >= self.expect:
                return
            if publisher.poll() is None:
                continue
            if now - max(moved, self._exited(now)) > self.quiet_s:
                return

    def _exited(self, now: float) -> float:
        """When the publisher was first seen gone."""
        if self.publisher_gone is None:
            self.publisher_gone = now
        return self.publisher_gone

    @property
    def rate(self) -> float:
        return self.n / (self.last - self.first) if self.last > self.first else 0.0


async def baseline(url: str, pool: str, nodes: int, count: int) -> tuple[float, int]:
    nc = await nats.connect(url)
    received = [0]

    async def on(_msg: Any) -> None:
        received[0] += 1

    await nc.subscribe(f"{PREFIX}.hb.>", cb=on, pending_msgs_limit=1_000_000)
    await nc.flush()
    proc = publish(url, pool, nodes, count)
    progress = Progress(count)
    await progress.settle(lambda: received[0], lambda: received[0], proc)
    proc.wait()
    await nc.close()
    return progress.rate, received[0]


@dataclass
class Run:
    sent: int  # what the publisher sent (0 when it failed: nothing can be said)
    rate: float
    processed: int
    dropped: dict[str, int]
    lags: list[float]

    @property
    def dropped_total(self) -> int:
        return sum(self.dropped.values())

    @property
    def lost(self) -> int:
        """Sent, and neither processed nor counted as dropped."""
        return self.sent - self.processed - self.dropped_total

    def accounted(self, name: str) -> Goal:
        ok = self.sent > 0 and self.lost == 0
        value = f"{self.processed + self.dropped_total:,} of {self.sent:,}"
        ratio = f"{(self.sent - self.lost) / self.sent:.3f}" if self.sent else "publisher failed"
        return Goal(f"{name}: processed + counted drops", value, ratio, "all accounted", ok)


async def coordinator_run(url: str, pool_id: str, nodes: int, count: int, rate: float) -> Run:
    """Blast (`rate` 0) or pace `count` heartbeats into a coordinator. Processed: handed
    to the node state service; dropped: what the coordinator counted as dropped (by the
    ingest, by reason, and by the NATS client as a slow consumer)."""
    with tempfile.TemporaryDirectory() as tmp:
        settings = CoordinatorSettings(
            database_url=f"sqlite:///{tmp}/bench.db", http_port=0,
            nats=ProbedNatsSettings(url=url, subject_prefix=PREFIX),
            bootstrap_operator_key=new_key(), insecure_bus=True,
            # Throughput, not fairness: each node here sends far beyond a real agent.
            ingest_node_rate=10_000, ingest_node_burst=1_000_000,
        )  # fmt: skip
        async with running_coordinator(settings) as c:
            await c.ledger.tenants.create("bench", "bench", 1)
            await c.ledger.pools.create(pool_id, "bench", "bench", None, 1)
            for i in range(nodes):
                node = f"node-{i:05d}"
                inv = Inventory(
                    node_id=node, pool_id=pool_id, boot_id="b", sent_at=0,
                    inventory_hash=f"hash-{i:05d}", health=NodeHealth(status="healthy"),
                    atoms=(Atom(atom_id=f"{node}:node", cls="node"),),
                )  # fmt: skip
                c.ingest.sink.on_inventory(inv)
            while len(c.tracker.nodes) < nodes:  # noqa: ASYNC110 - the writer loop fills it
                await asyncio.sleep(0.1)
            # Registration's aftermath (every node's `node.registered` alert, published to
            # JetStream one acknowledged message at a time) is not heartbeat ingest: let it
            # finish, so the blast measures the steady state the goal is about.
            while (await c.ledger.outbox.backlog()).unsent:  # noqa: ASYNC110 - the relay drains it
                await asyncio.sleep(0.1)
            lags: list[float] = []
            if rate:
                # Paced: the lag of every heartbeat (a timestamp each is affordable here).
                sink = c.ingest.sink
                original = sink.on_heartbeat

                def measured(hb: Heartbeat) -> None:
                    original(hb)
                    lags.append(time.time() * 1000 - hb.sent_at)

                sink.on_heartbeat = measured  # type: ignore[method-assign]
            accepted0 = c.ingest.accepted["hb"]

            dropped0 = dict(c.ingest.dropped)

            def dropped() -> dict[str, int]:
                # The NATS client's own drops of our messages are ingest's
                # `slow_consumer` (`Ingest.lost`).
                now = {k: v - dropped0.get(k, 0) for k, v in c.ingest.dropped.items()}
                return {k: v for k, v in now.items() if v}

            def processed() -> int:
                return c.ingest.accepted["hb"] - accepted0

            proc = publish(url, pool_id, nodes, count, rate)
            progress = Progress(count)
            await progress.settle(processed, lambda: processed() + sum(dropped().values()), proc)
            sent = count if proc.wait() == 0 else 0
            # The count is final once everything the server holds for us is read (a
            # round trip: its PONG comes after them) and handled. On a starved machine
            # nothing may move for seconds while messages are still on their way: a
            # quiet spell alone says nothing.
            await c.bus.flush(timeout_s=FINAL_FLUSH_S)
            while c.bus.backlog():  # noqa: ASYNC110 - the subscription drains it
                await asyncio.sleep(0.05)
            return Run(sent, progress.rate, processed(), dropped(), lags)


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
    parser.add_argument("--paced-seconds", type=float, default=5)
    parser.add_argument(
        "--starved-count", type=int, default=100_000, help="blast with every core busy"
    )
    args = parser.parse_args()
    with EmbeddedNats() as server:
        pool = new_pool_id()
        # The bare subscriber before and after the blast, the ratio against their mean:
        # on a shared machine the load drifts, and one side measured alone would carry it.
        before, base_received = await baseline(server.url, pool, args.nodes, args.count)
        blast = await coordinator_run(server.url, pool, args.nodes, args.count, 0)
        after, after_received = await baseline(server.url, new_pool_id(), args.nodes, args.count)
        base, base_received = (before + after) / 2, min(base_received, after_received)
        paced_count = int(args.rate * args.paced_seconds)
        paced = await coordinator_run(server.url, new_pool_id(), args.nodes, paced_count, args.rate)
        with cpu_hog():
            starved = await coordinator_run(
                server.url, new_pool_id(), args.nodes, args.starved_count, 0
            )
    lost = blast.lost
    ratio = blast.rate / base if base else 0.0
    p99 = pct(paced.lags, 0.99)
    result = {
        "count": args.count,
        "nodes": args.nodes,
        "baseline_msgs_per_s": round(base),
        "baseline_before_after_msgs_per_s": [round(before), round(after)],
        "baseline_received": base_received,
        "coordinator_hb_per_s": round(blast.rate),
        "ratio_to_baseline": round(ratio, 3),
        "processed": blast.processed,
        "dropped": blast.dropped,
        "lost_uncounted": lost,
        "paced_rate": args.rate,
        "paced_count": paced_count,
        "paced_processed": paced.processed,
        "paced_dropped": paced.dropped,
        "paced_lost_uncounted": paced.lost,
        "lag_ms_p50": round(statistics.median(paced.lags), 1) if paced.lags else None,
        "lag_ms_p99": round(p99, 1),
        "starved_count": args.starved_count,
        "starved_cpu_hogs": os.cpu_count(),
        "starved_hb_per_s": round(starved.rate),
        "starved_processed": starved.processed,
        "starved_dropped": starved.dropped,
        "starved_lost_uncounted": starved.lost,
    }
    print(
        f"bare nats-py subscriber: {base:,.0f} msg/s (before {before:,.0f}, after {after:,.0f};"
        f" at least {base_received:,} of {args.count:,})"
    )
    print(
        f"coordinator blast: {blast.rate:,.0f} hb/s; {blast.processed:,} processed, "
        f"{blast.dropped_total:,} dropped {blast.dropped}, {lost:,} unaccounted"
    )
    print(
        f"coordinator at {args.rate:,.0f}/s: {paced.processed:,} of {paced_count:,} processed, "
        f"lag p50 / p99 {result['lag_ms_p50']} / {result['lag_ms_p99']} ms"
    )
    print(
        f"coordinator blast, every core busy: {starved.rate:,.0f} hb/s; {starved.processed:,}"
        f" processed, {starved.dropped_total:,} dropped {starved.dropped},"
        f" {starved.lost:,} unaccounted"
    )
    goals = [
        Goal(
            "heartbeat ingest, max rate", f"{blast.rate:,.0f} hb/s",
            f"{ratio:.2f} of bare ({base:,.0f}/s)", ">= 30,000/s", blast.rate >= 30_000,
        ),
        blast.accounted(f"blast of {args.count:,}"),
        Goal(
            f"ingest lag p99 at {args.rate:,.0f}/s", f"{p99:,.0f} ms", "", "< 1,000 ms",
            bool(paced.lags) and p99 < 1000,
        ),
        paced.accounted(f"paced {paced_count:,}"),
        starved.accounted(f"blast of {args.starved_count:,}, every core busy"),
    ]  # fmt: skip
    return write("ingest", result, goals)


if __name__ == "__main__":
    # The same event loop the coordinator runs on (coordinator/main.py), for both sides.
    if "--asyncio" in sys.argv:
        sys.argv.remove("--asyncio")
        sys.exit(asyncio.run(main()))
    import uvloop

    sys.exit(uvloop.run(main()))
