"""One NATS connection for the coordinator, with connect/disconnect hooks.

The first connect is retried with backoff (the coordinator may start before NATS);
after that nats-py reconnects forever and tells us, so liveness can stop judging nodes
while we are the ones cut off.

`user_credentials` names a NATS JWT `.creds` file or the user/password file that
`gpufleet nats-auth` writes (see `ops.nats_auth`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import RetentionPolicy, StorageType, StreamConfig

from shared.credentials import CredentialsError, connect_options

log = logging.getLogger(__name__)

Hook = Callable[[], None]
MessageHandler = Callable[[Msg], Awaitable[None]]


def auth_options(path: str | None) -> dict[str, Any]:
    """nats-py connect options for a credentials file, read once per connect()."""
    if not path:
        return {}
    try:
        with open(path) as fh:
            text = fh.read()
    except OSError as exc:
        raise CredentialsError(f"nats_credentials: cannot read {path}: {exc.strerror}") from None
    return connect_options(text, path, f"nats_credentials {path}")


class Bus:
    def __init__(
        self,
        url: str,
        *,
        name: str = "gpufleet-coordinator",
        on_up: Hook | None = None,
        on_down: Hook | None = None,
        user_credentials: str | None = None,
    ) -> None:
        self.url = url
        self.name = name
        self._on_up = on_up
        self._on_down = on_down
        self._credentials = user_credentials
        self.nc: Client | None = None

    @property
    def connected(self) -> bool:
        return self.nc is not None and self.nc.is_connected

    async def connect(self, *, attempts: int = 0, connect_timeout_s: float = 5.0) -> None:
        """Connect, retrying with backoff; `attempts=0` retries until cancelled."""
        delay = 0.2
        tried = 0
        kwargs = auth_options(self._credentials)
        while True:
            tried += 1
            try:
                self.nc = await nats.connect(
                    servers=[self.url],
                    name=self.name,
                    connect_timeout=connect_timeout_s,
                    reconnect_time_wait=0.5,
                    max_reconnect_attempts=-1,
                    ping_interval=5,
                    max_outstanding_pings=2,
                    disconnected_cb=self._disconnected,
                    reconnected_cb=self._reconnected,
                    error_cb=self._error,
                    **kwargs,
                )
                break
            except (OSError, TimeoutError, nats.errors.NoServersError) as exc:
                if attempts and tried >= attempts:
                    raise
                log.warning(
                    "NATS at %s not reachable (%s); retrying in %.1fs", self.url, exc, delay
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
        log.info("connected to NATS at %s", self.url)
        if self._on_up:
            self._on_up()

    async def _disconnected(self) -> None:
        log.warning("disconnected from NATS")
        if self._on_down:
            self._on_down()

    async def _reconnected(self) -> None:
        log.info("reconnected to NATS")
        if self._on_up:
            self._on_up()

    async def _error(self, exc: Exception) -> None:
        log.debug("NATS client error: %s", exc)

    def _client(self) -> Client:
        if self.nc is None:
            raise RuntimeError("bus not connected")
        return self.nc

    async def subscribe(self, subject: str, handler: MessageHandler, queue: str = "") -> None:
        await self._client().subscribe(subject, queue=queue, cb=handler, pending_msgs_limit=200_000)

    async def publish(self, subject: str, payload: bytes) -> None:
        await self._client().publish(subject, payload)

    async def ensure_stream(
        self, name: str, subjects: list[str], max_msgs: int, max_age_s: float
    ) -> None:
        """A JetStream stream with bounded retention (count and age)."""
        js = self._client().jetstream(timeout=5)
        config = StreamConfig(
            name=name,
            subjects=subjects,
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            max_msgs=max_msgs,
            max_age=max_age_s,
        )
        try:
            await js.add_stream(config)
        except nats.js.errors.BadRequestError:
            await js.update_stream(config)

    async def flush(self, timeout_s: int = 5) -> None:
        await self._client().flush(timeout=timeout_s)

    async def close(self) -> None:
        if self.nc is not None and not self.nc.is_closed:
            try:
                await asyncio.wait_for(self.nc.drain(), timeout=5)
            except (TimeoutError, nats.errors.Error):
                await self.nc.close()
