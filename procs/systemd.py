"""The systemd readiness protocol (`Type=notify`), used by both daemons' `main`.

The one module in `shared/` that does I/O, and only when the caller passes the socket it
read from its own environment (`NOTIFY_SOCKET`); nothing here reads the environment.
"""

from __future__ import annotations

import logging
import socket

log = logging.getLogger(__name__)


def sd_notify(message: str, notify_socket: str | None) -> None:
    """Tell systemd about our state (`READY=1`, `STOPPING=1`); a no-op outside systemd.

    Never fatal: a lost notification must not take a daemon down."""
    if not notify_socket:
        return
    # A leading '@' names a socket in the abstract namespace.
    address = "\0" + notify_socket[1:] if notify_socket.startswith("@") else notify_socket
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(address)
            sock.sendall(message.encode())
    except OSError as exc:
        log.warning("cannot notify systemd at %s: %s", notify_socket, exc)
