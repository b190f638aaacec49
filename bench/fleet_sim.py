"""Heartbeats of a simulated fleet, paced: every node once per interval, spread evenly;
after `--silence-after` seconds the first `--silence` nodes stop (as if they died).

    python bench/fleet_sim.py URL PREFIX POOL --nodes 10000 --interval 5 \\
        --silence-after 30 --silence 100 --duration 60

Prints, when the silenced nodes sent their last heartbeat, one line of JSON per node.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import nats

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from shared.subjects import Subjects
from shared.wire import Heartbeat, NodeHealth


def node_id(i: int) -> str:
    return f"sim-{i:05d}"


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("prefix")
    p.add_argument("pool")
    p.add_argument("--nodes", type=int, default=10_000)
    p.add_argument("--interval", type=float, default=5.0)
    p.add_argument("--silence-after", type=float, default=30.0)
    p.add_argument("--silence", type=int, default=100)
    p.add_argument("--duration", type=float, default=60.0)
    a = p.parse_args()
    subjects = Subjects(a.prefix)
    frames = []
    for i in range(a.nodes):
        hb = Heartbeat(
            node_id=node_id(i), pool_id=a.pool, boot_id="b", seq=0, sent_at=0,
            interval_ms=int(a.interval * 1000), inventory_hash=f"h{i}",
            health=NodeHealth(status="healthy"),
        )  # fmt: skip
        raw = hb.to_json().replace(b'"seq":0', b'"seq":%d')
        frames.append((subjects.heartbeat(a.pool, node_id(i)), raw))
    nc = await nats.connect(a.url)
    started = time.monotonic()
    last_sent: dict[int, float] = {}
    tick = 0.05
    per_tick = max(1, int(a.nodes * tick / a.interval))
    cursor = 0
    while time.monotonic() - started < a.duration:
        silenced = time.monotonic() - started >= a.silence_after
        for _ in range(per_tick):
            i = cursor % a.nodes
            cursor += 1
            if silenced and i < a.silence:
                continue
            subject, raw = frames[i]
            # Each node's sequence grows, as a live agent's does (a repeat is stale).
            await nc.publish(subject, raw % (cursor // a.nodes + 1))
            if i < a.silence:
                last_sent[i] = time.time()
        await nc.flush()
        await asyncio.sleep(tick)
    await nc.close()
    for i in range(a.silence):
        print(json.dumps({"node": node_id(i), "lastSent": last_sent.get(i, 0.0)}), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
