"""`gpufleet-coordinator`: settings (the one place that reads the environment), logging,
signals, systemd readiness, run until told to stop. Exit 2: a configuration error."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Coroutine, Sequence
from functools import partial
from typing import Any

from coordinator.app import running_coordinator
from coordinator.config import CoordinatorSettings
from procs.settings import ConfigError, load
from procs.signals import Systemd, on_stop_signals, run_daemon

log = logging.getLogger("gpufleet.coordinator")


async def serve(settings: CoordinatorSettings, systemd: Systemd) -> int:
    stop = asyncio.Event()
    with on_stop_signals(stop.set, systemd):
        async with running_coordinator(settings) as coordinator:
            # READY only now: migrated, connected to NATS, subscribed, listening.
            systemd.ready()
            print(f"gpufleet-coordinator listening on {coordinator.url}", flush=True)
            await stop.wait()
    log.info("coordinator stopped")
    return 0


def run(coro: Coroutine[Any, Any, int]) -> int:
    """uvloop when it is installed (it is with gpufleet[coordinator] on Linux): the
    heartbeat ingest benchmark measures about 30 % more throughput with it."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings = load(CoordinatorSettings, argv, os.environ)
    except ConfigError as exc:
        print(f"gpufleet-coordinator: config error: {exc}", file=sys.stderr)
        return 2
    try:
        return run_daemon(
            partial(serve, settings), settings.log_level, os.environ, settings.log_format, run
        )
    except KeyboardInterrupt:
        return 0
    except ConfigError as exc:
        print(f"gpufleet-coordinator: refusing to start: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
