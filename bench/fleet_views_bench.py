"""The CLI's fleet views at fleet scale (issue 34, point 3): what `gpufleet gpus` and
`gpufleet nodes` (and each `watch` frame) cost the coordinator at N eight-GPU nodes,
as requests and wall time, read the old way (`nodes.list`, then `nodes.get` of each
node, 8 at a time) and through `gpus.list` (pages of 1,000 units). The API is served
in-process over real HTTP on a SQLite ledger; the client is the CLI's own (`ApiClient`).

    .venv/bin/python bench/fleet_views_bench.py [--nodes 1000] [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fleet import inventory

from coordinator.api.app import build_app
from coordinator.api.http.context import Services
from coordinator.ledger import Ledger
from coordinator.services.node_records import record_inventory
from coordinator.wiring.ledger import bootstrap_operator
from ops.kit.client import ApiClient
from ops.kit.keys import new_key
from shared.clock import SystemClock


class Counting(ApiClient):
    requests = 0

    def call(self, method: str, body: dict[str, Any]) -> Any:
        Counting.requests += 1
        return super().call(method, body)


def _pages(client: ApiClient, method: str, key: str, body: dict[str, Any]) -> list[Any]:
    return [item for page in client.pages(method, body) for item in page[key]]


def per_node(client: ApiClient) -> int:
    nodes = _pages(client, "nodes.list", "nodes", {"limit": 1000})
    with ThreadPoolExecutor(max_workers=8) as pool:
        details = list(pool.map(lambda n: client.call("nodes.get", {"nodeId": n["nodeId"]}), nodes))
    return sum(1 for d in details for a in d["atoms"] if a["class"] == "gpu")


def listed(client: ApiClient) -> int:
    return len(_pages(client, "gpus.list", "gpus", {"limit": 1000}))


async def main(nodes: int, runs: int) -> None:
    clock = SystemClock()
    with tempfile.TemporaryDirectory() as tmp:
        ledger = await Ledger.open(f"sqlite:///{tmp}/ledger.db")
        key = new_key()
        await bootstrap_operator(ledger, key, clock.now_ms())
        runner = web.AppRunner(build_app(Services(ledger, clock)))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]  # the port the OS gave: aiohttp's public API
        client = Counting(f"http://127.0.0.1:{port}", key, timeout_s=60)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, client.call, "tenants.create", {"tenantId": "acme"})
        made = await loop.run_in_executor(
            None, client.call, "pools.create", {"tenantId": "acme", "name": "big"}
        )
        for i in range(nodes):
            await record_inventory(ledger, inventory(i, made["poolId"]), clock.now_ms())
        for name, view in (("nodes.get per node", per_node), ("gpus.list", listed)):
            for _ in range(runs):
                Counting.requests = 0
                t0 = time.perf_counter()
                gpus = await loop.run_in_executor(None, view, client)
                took = time.perf_counter() - t0
                print(f"{name}: {nodes} nodes, {gpus} GPUs, {Counting.requests} requests, "
                      f"{took:.2f} s")  # fmt: skip
        await runner.cleanup()
        await ledger.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main(args.nodes, args.runs))
