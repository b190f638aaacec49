"""How a gpufleet daemon runs under systemd (`Type=notify`): SIGTERM and SIGINT ask it to
stop (`on_stop_signals`: set an event, for daemons that wind down themselves, the
coordinator and the agent; `run_until_signalled`: the main task cancelled, for the
ops daemons), and systemd hears `STOPPING=1` when they do (READY=1 is the daemon's to
say, when it is ready)."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager

from procs.systemd import sd_notify

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextmanager
def on_stop_signals(stop: Callable[[], object]) -> Iterator[None]:
    """`stop()` on SIGTERM or SIGINT while inside (set an event, cancel a task); the
    handlers are removed on the way out."""
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop)
    try:
        yield
    finally:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)


async def run_until_signalled(
    run: Callable[[str | None], Awaitable[None]],
    notify_socket: str | None,
    on_stop: Callable[[], None],
) -> int:
    """Await `run(notify_socket)` in this task; SIGTERM and SIGINT cancel it, and that is
    a clean stop (0): systemd hears `STOPPING=1`, then `on_stop` says what was done."""
    task = asyncio.current_task()
    assert task is not None
    try:
        with on_stop_signals(task.cancel):
            await run(notify_socket)
    except asyncio.CancelledError:
        sd_notify("STOPPING=1", notify_socket)
        on_stop()
    return 0
