"""How an ops daemon (the alert forwarder, the Slurm bridge) runs under systemd: its main
task until SIGTERM or SIGINT, then `STOPPING=1` to systemd and a last log line."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable

from procs.systemd import sd_notify


async def run_until_signalled(
    run: Callable[[str | None], Awaitable[None]],
    notify_socket: str | None,
    on_stop: Callable[[], None],
) -> int:
    """Await `run(notify_socket)` in this task; SIGTERM and SIGINT cancel it, and that is
    a clean stop (0): systemd hears `STOPPING=1`, then `on_stop` says what was done."""
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    try:
        await run(notify_socket)
    except asyncio.CancelledError:
        sd_notify("STOPPING=1", notify_socket)
        on_stop()
    return 0
