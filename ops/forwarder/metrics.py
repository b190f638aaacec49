"""The forwarder's Prometheus metrics, in its own registry, served as text at `/metrics`
on a listener of its own when `metrics_port` is set: what it delivered, and how often
its consumer on the alert stream was found changed behind its back or missing (each a
reason to look at who else holds NATS credentials)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import prometheus_client
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class ForwarderMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.consumer_mismatches = Counter(
            "gpufleet_alerts_consumer_mismatches_total",
            "Times its alert-stream consumer was found changed behind its back (set back,"
            " or the forwarder stops)", registry=r,
        )  # fmt: skip

    def watch(self, name: str, help_text: str, read: Callable[[], float]) -> None:
        """A gauge read from the forwarder when scraped (its running totals)."""
        gauge = Gauge(name, help_text, registry=self.registry)
        gauge.set_function(read)

    def text(self) -> bytes:
        return generate_latest(self.registry)

    @asynccontextmanager
    async def serving(self, host: str, port: int) -> AsyncIterator[int]:
        """`/metrics` on host:port (0: a free port) until the block ends; yields the port."""

        async def handler(_: web.Request) -> web.Response:
            return web.Response(body=self.text(), headers={"Content-Type": CONTENT_TYPE})

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
