"""The typed API clients: `Client` (sync, urllib) and `AsyncClient` (aiohttp, an
optional dependency imported on first use). One typed method per API method, grouped by
module (`client.reservations.create(...)`), generated into `generated.py`; failures are
`ApiError` (status, code, message, details) or `Unreachable`; 503s are retried with
backoff (`Retry`)."""

from __future__ import annotations

from types import TracebackType

from ops.apiclient.generated import AsyncMethods, Methods
from ops.apiclient.transport import AsyncTransport, Retry, SyncTransport


class Client(Methods):
    def __init__(
        self, base_url: str, key: str, *, timeout_s: float = 10.0, retry: Retry | None = None
    ) -> None:
        super().__init__(SyncTransport(base_url, key, timeout_s, retry or Retry()))


class AsyncClient(AsyncMethods):
    """Use as `async with AsyncClient(url, key) as client:` (or call `close()`)."""

    def __init__(
        self, base_url: str, key: str, *, timeout_s: float = 10.0, retry: Retry | None = None
    ) -> None:
        self._transport = AsyncTransport(base_url, key, timeout_s, retry or Retry())
        super().__init__(self._transport)

    async def close(self) -> None:
        await self._transport.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
