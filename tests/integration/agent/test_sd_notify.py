"""The agent as a systemd Type=notify service: READY=1 only once NATS is connected and the
first inventory is out, STOPPING=1 on SIGTERM. A real agent process reports to a
datagram socket standing in for systemd's."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

from ops.kit.embedded_nats import free_port
from shared.ids import new_pool_id
from shared.subjects import Subjects
from shared.wire import Inventory

AGENT = Path(sys.executable).parent / "gpufleet-agent"


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    path = str(tmp_path / "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.setblocking(False)
    try:
        yield sock, path
    finally:
        sock.close()


async def receive(sock: socket.socket, within_s: float) -> str:
    loop = asyncio.get_running_loop()
    return (await asyncio.wait_for(loop.sock_recv(sock, 4096), within_s)).decode()


async def start_agent(nats_url: str, path: str, prefix: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        str(AGENT),
        "--pool-id", new_pool_id(),
        "--node-id", "sd-01",
        "--nats-url", nats_url,
        "--subject-prefix", prefix,
        "--simulate", "l40s-pcie-4",
        "--interval", "0.5",
        env={**os.environ, "NOTIFY_SOCKET": path},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip


async def stop(proc: asyncio.subprocess.Process) -> tuple[int, bytes]:
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
    _, err = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode is not None
    return proc.returncode, err


async def test_ready_after_the_first_inventory_and_stopping_on_sigterm(
    nats_url: str, notify_socket: tuple[socket.socket, str]
) -> None:
    sock, path = notify_socket
    prefix = "tsd" + os.urandom(3).hex()
    nc = await nats.connect(nats_url)
    inventories: list[Inventory] = []

    async def on_inv(msg: nats.aio.msg.Msg) -> None:
        inventories.append(Inventory.from_json(msg.data))

    await nc.subscribe(Subjects(prefix).all_inventories, cb=on_inv)
    await nc.flush()
    proc = await start_agent(nats_url, path, prefix)
    try:
        assert await receive(sock, 30) == "READY=1"
        # The inventory was handed to NATS before READY=1; give delivery a moment.
        for _ in range(100):
            if inventories:
                break
            await asyncio.sleep(0.05)
        assert [i.node_id for i in inventories[:1]] == ["sd-01"]
    finally:
        code, err = await stop(proc)
        await nc.close()
    assert code == 0, err.decode()
    assert await receive(sock, 5) == "STOPPING=1"


async def test_no_ready_while_nats_is_unreachable(
    notify_socket: tuple[socket.socket, str],
) -> None:
    sock, path = notify_socket
    proc = await start_agent(f"nats://127.0.0.1:{free_port()}", path, "tsd")
    try:
        with pytest.raises(TimeoutError):
            await receive(sock, 3)
        assert proc.returncode is None
    finally:
        await stop(proc)
    # Whatever ended it, systemd hears nothing but STOPPING=1, and never READY=1.
    leftover = []
    while True:
        try:
            leftover.append(sock.recv(4096).decode())
        except BlockingIOError:
            break
    assert "READY=1" not in leftover
