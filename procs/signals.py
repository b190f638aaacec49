"""How a gpufleet daemon runs under systemd (`Type=notify`), the one form for the
coordinator, the agent and both ops daemons: its logs set up (`procs.logs`), SIGTERM and
SIGINT asking it to stop (`on_stop_signals`: set an event, for daemons that wind down
themselves, the coordinator and the agent; `run_until_signalled`: the main task
cancelled, for the ops daemons, whose whole life is `serve`), and systemd told
(`Systemd`): READY=1 when the daemon says it is ready, STOPPING=1 once, when a stop
signal comes or it winds down for any other reason."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Protocol, TypeVar

from procs import logs
from procs.logs import LogFormat
from procs.nats import CredentialsError
from procs.redact import redact
from procs.settings import ConfigError
from procs.systemd import sd_notify

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Systemd:
    """A daemon's word to systemd on the socket it was given (`NOTIFY_SOCKET`; None
    outside systemd: then nothing is said)."""

    def __init__(self, notify_socket: str | None) -> None:
        self.notify_socket = notify_socket
        self._stopping = False

    def ready(self) -> None:
        sd_notify("READY=1", self.notify_socket)

    def stopping(self) -> None:
        """STOPPING=1, the first time only."""
        if not self._stopping:
            self._stopping = True
            sd_notify("STOPPING=1", self.notify_socket)


@contextmanager
def on_stop_signals(
    stop: Callable[[], object],
    systemd: Systemd | None = None,
    also: Mapping[signal.Signals, Callable[[], object]] | None = None,
) -> Iterator[None]:
    """`stop()` on SIGTERM or SIGINT while inside (set an event, cancel a task), systemd
    hearing STOPPING=1 first, and on the way out whatever ended it; `also`: the daemon's
    other signals (the agent's SIGUSR1/SIGUSR2). The handlers are removed on the way
    out."""
    loop = asyncio.get_running_loop()

    def stopping() -> None:
        if systemd is not None:
            systemd.stopping()
        stop()

    handlers: dict[signal.Signals, Callable[[], object]] = {s: stopping for s in STOP_SIGNALS}
    handlers |= dict(also or {})
    for sig, handler in handlers.items():
        loop.add_signal_handler(sig, handler)
    try:
        yield
    finally:
        if systemd is not None:
            systemd.stopping()
        for sig in handlers:
            loop.remove_signal_handler(sig)


def run_daemon(
    main: Callable[[Systemd], Coroutine[Any, Any, int]],
    log_level: str | int,
    env: Mapping[str, str],
    log_format: LogFormat = "text",
    runner: Callable[[Coroutine[Any, Any, int]], int] = asyncio.run,
) -> int:
    """A daemon's life from its settings on: logs set up, then `main(systemd)` run to its
    exit status on `runner` (the coordinator's: uvloop where installed)."""
    logs.configure(log_level, log_format)
    return runner(main(Systemd(env.get("NOTIFY_SOCKET"))))


async def run_until_signalled(
    run: Callable[[Callable[[], None]], Awaitable[None]],
    systemd: Systemd,
    on_stop: Callable[[], None],
) -> int:
    """Await `run(systemd.ready)` in this task; SIGTERM and SIGINT cancel it, and that is
    a clean stop (0): systemd hears `STOPPING=1`, then `on_stop` says what was done."""
    task = asyncio.current_task()
    assert task is not None
    try:
        with on_stop_signals(task.cancel, systemd):
            await run(systemd.ready)
    except asyncio.CancelledError:
        on_stop()
    return 0


class Daemon(Protocol):
    async def run(self, ready: Callable[[], None] | None = None) -> None: ...


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

    async def main(systemd: Systemd) -> int:
        return await run_until_signalled(daemon.run, systemd, lambda: stopped(daemon))

    return asyncio.run(main(Systemd(env.get("NOTIFY_SOCKET"))))
