"""How the typed clients reach the API: one HTTP request, its JSON answer or a typed
`ApiError`, for both conventions (compute methods' envelope; the interval API's plain
text 400/404 and its own 409 bodies), retried on 503 with exponential backoff.

A 503 means the coordinator did not take the request (not the leader, starting, shutting
down), so a write is retried as safely as a read. The sync transport uses urllib (the
base install); the async one aiohttp, imported only when it is first used.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ops.client import ApiError, Unreachable, method_path

if TYPE_CHECKING:
    import aiohttp

Query = Mapping[str, str | int | None]


@dataclass(frozen=True, slots=True)
class Retry:
    """Tries in all (1: no retry) and the backoff between them; a `Retry-After` of a
    few seconds is honoured up to `max_backoff_s`."""

    attempts: int = 4
    backoff_s: float = 0.2
    max_backoff_s: float = 5.0

    def delay(self, attempt: int, retry_after: str | None) -> float:
        if retry_after is not None and retry_after.strip().isdigit():
            return min(float(retry_after), self.max_backoff_s)
        return min(self.backoff_s * 2.0**attempt, self.max_backoff_s)


def error_from(status: int, content_type: str, raw: bytes, url: str) -> ApiError:
    """The envelope's code, message and details; the interval API's plain text
    (`INVALID_REQUEST`, `NOT_FOUND`) and its `{"error": word, …}` 409s (details: the rest
    of the body, e.g. `intervals`)."""
    text = raw.decode(errors="replace")
    if "json" in content_type:
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if isinstance(body, dict):
            err = body.get("error")
            if isinstance(err, dict):
                return ApiError(status, str(err.get("code")), str(err.get("message", "")),
                                err.get("details", {}), url)  # fmt: skip
            if isinstance(err, str):
                details = {k: v for k, v in body.items() if k not in ("error", "message")}
                return ApiError(status, err, str(body.get("message", err)), details, url)
    code = {400: "INVALID_REQUEST", 404: "NOT_FOUND", 503: "UNAVAILABLE"}.get(status, "HTTP")
    return ApiError(status, code, text.strip() or f"HTTP {status}", {}, url)


def _url(base: str, path: str, query: Query | None) -> str:
    params = {k: str(v) for k, v in (query or {}).items() if v is not None}
    return base + path + ("?" + urllib.parse.urlencode(params) if params else "")


def _decode(raw: bytes, url: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        raise Unreachable(url, "the answer is not JSON: is it a gpufleet coordinator?") from None


class SyncTransport:
    def __init__(self, base_url: str, key: str, timeout_s: float, retry: Retry) -> None:
        self.base_url = base_url.rstrip("/")
        self.key = key
        self.timeout_s = timeout_s
        self.retry = retry

    def call(self, method: str, body: Mapping[str, Any]) -> Any:
        """A compute method: POST its JSON body."""
        return self.request("POST", method_path(method), body=body)

    def request(
        self, verb: str, path: str, *, query: Query | None = None,
        headers: Mapping[str, str | None] | None = None, body: Any = None,
    ) -> Any:  # fmt: skip
        url = _url(self.base_url, path, query)
        sent = {k: v for k, v in (headers or {}).items() if v is not None}
        sent["Authorization"] = f"Bearer {self.key}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            sent["Content-Type"] = "application/json"
        for attempt in range(self.retry.attempts):
            request = urllib.request.Request(url, data=data, headers=sent, method=verb)
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    return _decode(response.read(), url)
            except urllib.error.HTTPError as exc:
                error = error_from(exc.code, exc.headers.get("Content-Type", ""), exc.read(), url)
                if exc.code != 503 or attempt + 1 == self.retry.attempts:
                    raise error from None
                time.sleep(self.retry.delay(attempt, exc.headers.get("Retry-After")))
            except urllib.error.URLError as exc:
                raise Unreachable(url, str(exc.reason)) from None
            except (http.client.HTTPException, OSError) as exc:
                raise Unreachable(url, f"{exc.__class__.__name__}: {exc}") from None
        raise AssertionError("unreachable: the last attempt returns or raises")


class AsyncTransport:
    def __init__(self, base_url: str, key: str, timeout_s: float, retry: Retry) -> None:
        self.base_url = base_url.rstrip("/")
        self.key = key
        self.timeout_s = timeout_s
        self.retry = retry
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            import aiohttp  # optional: only the async client needs it

            timeout = aiohttp.ClientTimeout(total=self.timeout_s)
            self._session = aiohttp.ClientSession(timeout=timeout)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def call(self, method: str, body: Mapping[str, Any]) -> Any:
        return await self.request("POST", method_path(method), body=body)

    async def request(
        self, verb: str, path: str, *, query: Query | None = None,
        headers: Mapping[str, str | None] | None = None, body: Any = None,
    ) -> Any:  # fmt: skip
        import aiohttp

        session = self._open()
        url = _url(self.base_url, path, query)
        sent = {k: v for k, v in (headers or {}).items() if v is not None}
        sent["Authorization"] = f"Bearer {self.key}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            sent["Content-Type"] = "application/json"
        for attempt in range(self.retry.attempts):
            try:
                async with session.request(verb, url, data=data, headers=sent) as response:
                    raw = await response.read()
                    if response.status < 400:
                        return _decode(raw, url)
                    error = error_from(response.status, response.content_type, raw, url)
                    retry_after = response.headers.get("Retry-After")
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise Unreachable(url, f"{exc.__class__.__name__}: {exc}") from None
            if error.status != 503 or attempt + 1 == self.retry.attempts:
                raise error
            await asyncio.sleep(self.retry.delay(attempt, retry_after))
        raise AssertionError("unreachable: the last attempt returns or raises")
