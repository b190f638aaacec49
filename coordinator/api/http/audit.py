"""What access and audit log lines say about an API call (no aiohttp here).

Every request gets an access line (`gpufleet.access`): verb, path, method, status, time,
the calling key and its tenant. Every write and every admin method also gets an audit
line (`gpufleet.audit`): who (key id and tenant), what (the method and its input) and
the result (status and error code). Secrets never appear: the key itself is never
logged (only its id), answers are never logged, and input fields whose names say they
hold a secret are replaced.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import BaseModel

from coordinator.api.http.registry import Method
from coordinator.api.shapes.base import RestInput
from coordinator.domain.model import Principal

access_log = logging.getLogger("gpufleet.access")
audit_log = logging.getLogger("gpufleet.audit")

_SECRET_WORDS = ("key", "secret", "password", "token", "credential")
_SAFE = frozenset({"keyId", "idempotencyKey", "topologyKey"})
MAX_INPUT_CHARS = 4096


def audited(method: Method) -> bool:
    return method.kind == "write" or method.permission == "platform:admin"


def redact(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: "<redacted>"
            if k not in _SAFE and any(w in k.lower() for w in _SECRET_WORDS)
            else redact(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [redact(v) for v in value]
    return value


def input_fields(body: Any) -> Any:
    """The validated input as the caller named it, redacted; a seed-002 body as its size."""
    if isinstance(body, RestInput):
        return {
            k: (f"<{len(v)} bytes>" if isinstance(v, bytes) else v)
            for k, v in body.model_dump(by_alias=True, exclude_none=True).items()
        }
    if isinstance(body, BaseModel):
        return redact(body.model_dump(mode="json", by_alias=True, exclude_unset=True))
    return None


def who(principal: Principal | None) -> dict[str, Any]:
    if principal is None:
        return {"keyId": None, "tenantId": None}
    return {"keyId": principal.key_id, "tenantId": principal.tenant_id}


def log_access(
    verb: str, path: str, method: Method | None, principal: Principal | None, status: int,
    code: str | None, elapsed_ms: float,
) -> None:  # fmt: skip
    fields = {
        "event": "access", "verb": verb, "path": path,
        "method": method.name if method else None, "status": status, "code": code,
        "ms": round(elapsed_ms, 1), **who(principal),
    }  # fmt: skip
    access_log.info("%s %s %d", verb, path, status, extra={"fields": fields})


def log_audit(
    method: Method, principal: Principal | None, body: Any, status: int, code: str | None
) -> None:
    text = input_fields(body)
    shown = str(text)
    if len(shown) > MAX_INPUT_CHARS:
        text = shown[:MAX_INPUT_CHARS] + "…"
    result = "ok" if status < 400 else "refused" if status < 500 else "failed"
    fields = {
        "event": "audit", "method": method.name, **who(principal), "input": text,
        "result": result, "status": status, "code": code,
    }  # fmt: skip
    audit_log.info("%s by %s: %s", method.name, fields["keyId"], result, extra={"fields": fields})
