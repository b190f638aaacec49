"""The coordinator under systemd (`Type=notify`), through the one daemon form
(`procs.signals`): READY=1 once it listens, STOPPING=1 when SIGTERM comes, then a clean
exit 0."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from pathlib import Path

from coordinator.main import serve
from procs.signals import Systemd
from tests.integration.conftest import coordinator_settings


async def test_ready_once_listening_and_stopping_on_sigterm(
    tmp_path: Path, database_url: str, nats_url: str
) -> None:
    path = str(tmp_path / "notify")
    loop = asyncio.get_running_loop()
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        sock.setblocking(False)
        settings = coordinator_settings(database_url, nats_url)
        running = asyncio.create_task(serve(settings, Systemd(path)))
        said = await asyncio.wait_for(loop.sock_recv(sock, 4096), 60)
        assert said == b"READY=1"
        os.kill(os.getpid(), signal.SIGTERM)
        said = await asyncio.wait_for(loop.sock_recv(sock, 4096), 10)
        assert said == b"STOPPING=1"
        assert await asyncio.wait_for(running, 30) == 0
