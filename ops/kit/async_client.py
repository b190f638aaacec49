"""The API client for asyncio (the Slurm bridge), over an aiohttp session the caller
owns: one call, or every page of a listing, decoded into the caller's msgspec model of
just the fields it reads. It fails as `ops.kit.client` does: `ApiError` for the API's
error envelope, `Unreachable` when no answer of the API came back (refused, timed out,
not its answer)."""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

import aiohttp
import msgspec

from ops.kit.client import Unreachable, api_error, method_path, require_tls

__all__ = ["AsyncApiClient"]


class Page(Protocol):
    @property
    def next_cursor(self) -> str | None: ...


T = TypeVar("T")
P = TypeVar("P", bound=Page)


class AsyncApiClient:
    def __init__(
        self, http: aiohttp.ClientSession, base_url: str, key: str, *, insecure_http: bool = False
    ) -> None:
        require_tls(base_url, insecure_http)  # InsecureHttp: before any connection
        self.http = http
        self.base_url = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {key}"}

    async def call(self, method: str, body: dict[str, Any], answer: type[T]) -> T:
        """POST /api/compute/<module>/<method>; the answer decoded as `answer`."""
        url = self.base_url + method_path(method)
        try:
            async with self.http.post(url, json=body, headers=self._headers) as resp:
                raw = await resp.read()
                if resp.status != 200:
                    raise api_error(resp.status, raw, url, resp.reason or "")
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise Unreachable(url, f"{type(exc).__name__}: {exc}") from None
        try:
            return msgspec.json.decode(raw, type=answer)
        except msgspec.DecodeError as exc:
            raise Unreachable(url, f"not its answer ({exc})") from None

    async def pages(self, method: str, body: dict[str, Any], page: type[P]) -> list[P]:
        """Every page of a listing, following `nextCursor` to the end."""
        items: list[P] = []
        cursor: str | None = None
        while True:
            got = await self.call(method, body | ({"cursor": cursor} if cursor else {}), page)
            items.append(got)
            cursor = got.next_cursor
            if not cursor:
                return items
