"""A small synchronous API client (stdlib only) for the CLI, the demo and scripts."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, details: Any) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.details = details


class ApiClient:
    def __init__(self, base_url: str, key: str, timeout_s: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.key = key
        self.timeout_s = timeout_s

    def call(self, method: str, body: dict[str, Any]) -> Any:
        """POST /api/compute/<module>/<method> with a JSON body; raises ApiError."""
        module, _, name = method.partition(".")
        if not module or not name:
            raise ValueError(f"method must look like module.method, got {method!r}")
        request = urllib.request.Request(
            f"{self.base_url}/api/compute/{module}/{name}",
            data=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                err = json.loads(raw)["error"]
            except (ValueError, KeyError, TypeError):
                raise ApiError(exc.code, "HTTP", raw.decode(errors="replace"), {}) from None
            raise ApiError(exc.code, err["code"], err["message"], err["details"]) from None

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.base_url}/healthz", timeout=1) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False
