"""The API client, synchronous (stdlib only) for the CLI, the demo and scripts; its
async twin for the Slurm bridge is `ops.kit.async_client` (aiohttp).

Every failure is one exception naming the URL it tried: `ApiError` for the API's error
envelope (code, message, the failing fields), `Unreachable` for anything that kept the
request from getting an API answer (refused, timed out, not HTTP — a NATS port answers
`INFO {…}` —, not JSON).

Both clients refuse a plain `http://` URL to a host that is not loopback before any
connection (`InsecureHttp`): the API key would cross the network in clear. The caller
says `insecure_http=True` (`--insecure-http`) to allow it, say behind a TLS-terminating
tunnel it trusts.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import socket
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

from ops.kit.errors import OpsError


class ClientError(OpsError):
    """Root of what the client raises."""


class Unreachable(ClientError):
    def __init__(self, url: str, why: str) -> None:
        super().__init__(f"{url}: {why}")
        self.url = url
        self.why = why

    def one_line(self) -> str:
        return f"cannot reach the coordinator at {self.url}: {self.why}"


class ApiError(ClientError):
    def __init__(self, status: int, code: str, message: str, details: Any, url: str = "") -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.details = details
        self.url = url

    @property
    def fields(self) -> list[str]:
        """`path: message` for each failing field the envelope names."""
        found = self.details.get("fields", []) if isinstance(self.details, dict) else []
        return [
            f"{f.get('path', '?')}: {f.get('message', '')}" for f in found if isinstance(f, dict)
        ]

    def one_line(self) -> str:
        fields = "; ".join(self.fields)
        return f"{self.url}: {self.status} {self.code}: {self.message}" + (
            f" ({fields})" if fields else ""
        )


class InsecureHttp(ClientError):
    """A plain http:// URL to a host off this machine, not allowed (exit 2)."""

    exit_code = 2


def is_loopback_host(host: str) -> bool:
    """`localhost` or a loopback address, as written (no name is looked up)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def require_tls(base_url: str, insecure_http: bool = False) -> None:
    """Raise InsecureHttp for `http://` to a non-loopback host unless `insecure_http`."""
    try:
        parts = urllib.parse.urlsplit(base_url)
    except ValueError:
        return  # a malformed URL: the call says so, naming it, as for any unreachable URL
    if parts.scheme != "http" or insecure_http:
        return
    if not is_loopback_host(parts.hostname or ""):
        raise InsecureHttp(
            f"{base_url}: plain http:// to another host would send the API key in clear;"
            " use https://, or allow it with --insecure-http (insecure_http = true)"
        )


def method_path(method: str) -> str:
    module, _, name = method.partition(".")
    if not module or not name or "/" in method or " " in method:
        raise ValueError(f"a method looks like module.method (capacity.summary), not {method!r}")
    return f"/api/compute/{module}/{name}"


class ApiClient:
    def __init__(
        self, base_url: str, key: str, timeout_s: float = 10.0, *, insecure_http: bool = False
    ) -> None:
        require_tls(base_url, insecure_http)
        self.base_url = base_url.rstrip("/")
        self.key = key
        self.timeout_s = timeout_s

    def call(self, method: str, body: dict[str, Any]) -> Any:
        """POST /api/compute/<module>/<method> with a JSON body; raises ApiError or
        Unreachable (and ValueError for a malformed method name)."""
        url = self.base_url + method_path(method)
        raw = self._post(url, body, lambda response: response.read())
        try:
            return json.loads(raw)
        except ValueError:
            why = "the answer is not JSON: is it a gpufleet coordinator?"
            raise Unreachable(url, why) from None

    def pages(self, method: str, body: dict[str, Any]) -> Iterator[Any]:
        """Each page of a listing in turn, following `nextCursor` to the end (the async
        client's `pages` is the same walk); a caller that has enough stops early."""
        cursor: str | None = None
        while True:
            page = self.call(method, body | ({"cursor": cursor} if cursor else {}))
            yield page
            cursor = page.get("nextCursor")
            if not cursor:
                return

    def download(self, method: str, body: dict[str, Any], out: BinaryIO) -> int:
        """POST a method that streams its answer (an export) and copy it to `out` as it
        comes; the bytes written."""
        url = self.base_url + method_path(method)

        def copy(response: Any) -> int:
            total = 0
            while chunk := response.read(1 << 16):
                out.write(chunk)
                total += len(chunk)
            return total

        return int(self._post(url, body, copy))

    def _post(self, url: str, body: dict[str, Any], read: Callable[[Any], Any]) -> Any:
        try:
            if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
                raise ValueError("not an http:// or https:// URL")
            request = urllib.request.Request(
                url,
                data=json.dumps(body).encode(),
                headers={"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"},
                method="POST",
            )
        except ValueError as exc:
            raise Unreachable(url, f"{exc} (e.g. http://127.0.0.1:8080)") from None
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return read(response)
        except urllib.error.HTTPError as exc:
            raise _api_error(exc, url) from None
        except urllib.error.URLError as exc:
            raise Unreachable(url, _reason(exc.reason)) from None
        except (http.client.HTTPException, ConnectionError) as exc:
            raise Unreachable(url, _not_http(exc)) from None
        except TimeoutError:
            raise Unreachable(url, f"no answer within {self.timeout_s:g}s") from None
        except OSError as exc:
            raise Unreachable(url, exc.strerror or str(exc)) from None
        except ValueError as exc:  # urllib: "unknown url type"
            raise Unreachable(url, f"not a usable URL ({exc})") from None

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.base_url}/healthz", timeout=1) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError):
            return False


def _api_error(exc: urllib.error.HTTPError, url: str) -> ApiError:
    return api_error(exc.code, exc.read(), url, exc.reason)


def api_error(status: int, raw: bytes, url: str, reason: str = "") -> ApiError:
    """The API's error envelope in a non-200 answer (or its first line, when it has none)."""
    try:
        err = json.loads(raw)["error"]
        return ApiError(status, err["code"], err["message"], err.get("details", {}), url)
    except (ValueError, KeyError, TypeError):
        text = raw.decode(errors="replace").strip().splitlines()
        return ApiError(status, "HTTP", text[0] if text else reason, {}, url)


def _reason(reason: object) -> str:
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused: is the coordinator running there?"
    if isinstance(reason, socket.gaierror):
        return f"unknown host ({reason.strerror})"
    if isinstance(reason, TimeoutError):
        return "timed out"
    if isinstance(reason, OSError):
        return reason.strerror or str(reason)
    return str(reason)


def _not_http(exc: Exception) -> str:
    if isinstance(exc, http.client.BadStatusLine | http.client.RemoteDisconnected):
        line = str(exc).strip()
        if line.startswith("INFO") or "nats" in line.lower():
            return "that is a NATS server, not the coordinator's HTTP API (check the port)"
        return "the server there does not speak HTTP (check the port)"
    return f"connection failed ({exc.__class__.__name__}: {exc})"
