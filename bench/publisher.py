"""Load generator for the ingest benchmark: publishes heartbeats to a NATS server as fast
as it can (or at a set rate), from its own process so that it does not share a core's
event loop with the consumer it measures.

    python bench/publisher.py URL PREFIX POOL NODES COUNT [RATE]

sentAt carries the publish time (ms), so the consumer can measure lag; each node's seq
grows from 1.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import nats

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from shared.subjects import Subjects
from shared.wire import Heartbeat, NodeHealth


async def main(url: str, prefix: str, pool: str, nodes: int, count: int, rate: float) -> None:
    subjects = Subjects(prefix)
    templates = []
    for i in range(nodes):
        hb = Heartbeat(
            node_id=f"node-{i:05d}", pool_id=pool, boot_id="b", seq=0, sent_at=0,
            interval_ms=5000, inventory_hash=f"hash-{i:05d}", health=NodeHealth(status="healthy"),
        )  # fmt: skip
        raw = hb.to_json().replace(b'"seq":0', b'"seq":%d').replace(b'"sentAt":0', b'"sentAt":%d')
        templates.append((subjects.heartbeat(pool, f"node-{i:05d}"), raw))
    nc = await nats.connect(url, pending_size=64 * 1024 * 1024)
    started = time.perf_counter()
    batch = 500
    for n in range(0, count, batch):
        now_ms = int(time.time() * 1000)
        for k in range(n, min(n + batch, count)):
            subject, raw = templates[k % nodes]
            # Each node's sequence grows, as a live agent's does (a repeat is stale).
            await nc.publish(subject, raw % (k // nodes + 1, now_ms))
        if rate:
            due = started + (n + batch) / rate
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
    await nc.flush(timeout=30)
    await nc.close()


if __name__ == "__main__":
    url, prefix, pool, nodes, count = sys.argv[1:6]
    rate = float(sys.argv[6]) if len(sys.argv) > 6 else 0.0
    asyncio.run(main(url, prefix, pool, int(nodes), int(count), rate))
