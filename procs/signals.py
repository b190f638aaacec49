"""How a gpufleet daemon runs under systemd (`Type=notify`): SIGTERM and SIGINT ask it to
stop (`on_stop_signals`: set an event, for daemons that wind down themselves, the
coordinator and the agent; `run_until_signalled`: the main task cancelled, for the
ops daemons, whose whole life is `serve`), and systemd hears `STOPPING=1` when they
do (READY=1 is the daemon's to say, when it is ready)."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Protocol, TypeVar

from procs import logs
from procs.nats import CredentialsError
from procs.redact import redact
from procs.settings import ConfigError
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


class Daemon(Protocol):
    async def run(self, notify_socket: str | None = None) -> None: ...


D = TypeVar("D", bound=Daemon)


def serve(
    prog: str,
    log_level: str,
    start: Callable[[], D],
    stopped: Callable[[D], None],
    env: Mapping[str, str],
    say: Callable[[str], str] = redact,
) -> int:
    """An ops daemon's life: logs set up, the daemon built by `start` (a setting it
    cannot use: `prog: why` on stderr through `say`, exit 2), then run until SIGTERM or
    SIGINT (0), `stopped(daemon)` saying what it did."""
    logs.configure(log_level)
    try:
        daemon = start()
    except (ConfigError, CredentialsError, OSError) as exc:
        print(f"{prog}: {say(str(exc))}", file=sys.stderr)
        return 2
    notify_socket = env.get("NOTIFY_SOCKET")
    return asyncio.run(run_until_signalled(daemon.run, notify_socket, lambda: stopped(daemon)))
