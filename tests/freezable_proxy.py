"""A TCP proxy on loopback whose links can be frozen: bytes stop flowing both ways but
no socket closes, as on a half-open link (a stalled NAT, a dead switch port). While
frozen, new connections are refused (nothing listens): nats-py leaks the socket of a
reconnect attempt that times out waiting for the server's INFO, which a test that
turns warnings into errors cannot have."""

from __future__ import annotations

import asyncio
import contextlib


class FreezableProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self._target = (target_host, target_port)
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()
        self.port = 0

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    def freeze(self) -> None:
        self._flowing.clear()
        if self._server is not None:
            self._server.close()  # stops listening; the open links stay, stalled

    async def thaw(self) -> None:
        self._flowing.set()
        if self._server is not None and not self._server.is_serving():
            await self.start()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self._target)
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pipe(src, dst))
            self._pipes.add(task)
            task.add_done_callback(self._pipes.discard)

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                await self._flowing.wait()  # frozen: hold it, read no more, close nothing
                dst.write(data)
                await dst.drain()
        except OSError:
            pass
        finally:
            dst.close()

    async def close(self) -> None:
        self._flowing.set()
        if self._server is not None:
            self._server.close()
        for task in list(self._pipes):
            task.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), timeout=2)
