"""The `/metrics` endpoint of an ops daemon (the alert forwarder, the Slurm bridge): one
Prometheus registry served over HTTP on host:port while a block runs, in the text
exposition format, with no `_created` series (they double every counter for nothing)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import prometheus_client
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest

prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def exposition(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)


@asynccontextmanager
async def serving(registry: CollectorRegistry, host: str, port: int) -> AsyncIterator[int]:
    """`/metrics` on host:port (0: a free port) until the block ends; yields the port."""

    async def handler(_: web.Request) -> web.Response:
        return web.Response(body=exposition(registry), headers={"Content-Type": CONTENT_TYPE})

    app = web.Application()
    app.router.add_get("/metrics", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    try:
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()
