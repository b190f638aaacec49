"""aiohttp application: routes generated from the registry, authentication, body
validation, and the one place where errors become the `{"error": …}` envelope.

Hardening lives here too, because this is the only aiohttp importer: bodies are read
whole within a size and a time limit (`coordinator.api.http.body`), idle and slow-header
connections are closed after `HttpLimits.idle_timeout_s`, every answer carries the
security headers and a quiet `Server` header (and `Cache-Control: no-store`, since
some carry new keys), and `/metrics` answers only to its token or an operator key
(or moves to a listener of its own), because it names every tenant's pools.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web
from pydantic import ValidationError

from coordinator.api.http import audit
from coordinator.api.http.auth import authenticate, authorize, bearer_key
from coordinator.api.http.body import (
    BodyError,
    TooLarge,
    TooSlow,
    check_text,
    read_whole,
    strict_json,
)
from coordinator.api.http.console import add_console_routes
from coordinator.api.http.context import CallContext, Services
from coordinator.api.http.openapi import build_openapi
from coordinator.api.http.registry import Method, Registry, Reply, Streamed
from coordinator.api.http.render import error_body
from coordinator.api.shapes.base import ApiOutput, Prebuilt, RestInput, dump, where
from coordinator.api.shapes.interval_outputs import IdempotencyConflictBody
from coordinator.domain.errors import (
    CoordinatorError,
    IdempotencyKeyConflict,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    RequestTimeout,
    Unauthenticated,
)
from coordinator.domain.intervals import IntervalError
from coordinator.domain.model import Principal
from coordinator.runtime.metrics import CONTENT_TYPE

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 1024 * 1024
SERVICES = web.AppKey("services", Services)

SECURITY_HEADERS = {
    "Server": "gpufleet",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": "default-src 'none'; frame-ancestors 'none'",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """Time limits of the HTTP server and who may read `/metrics`."""

    # A connection with no complete request header within this long is closed (idle
    # keep-alive connections and slow-header clients alike).
    idle_timeout_s: float = 15.0
    body_timeout_s: float = 30.0
    # `Authorization: Bearer <token>` that reads /metrics (an operator key does too).
    metrics_token: str | None = None
    # False: /metrics is served on a listener of its own (`metrics_app`), not here.
    metrics_on_api: bool = True


LIMITS = web.AppKey("limits", HttpLimits)


def field_path(loc: tuple[int | str, ...]) -> str:
    """("devices", 0, "count") → "devices[0].count"."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + part
    return out or "(body)"


def invalid_input(exc: ValidationError) -> InvalidInput:
    fields = [
        {"path": field_path(e["loc"]), "message": e["msg"], "type": e["type"]}
        for e in exc.errors(include_url=False, include_input=False)
    ]
    paths = ", ".join(dict.fromkeys(f["path"] for f in fields))
    return InvalidInput(f"invalid input: {paths}", {"fields": fields})


METHOD_LABEL = web.RequestKey("gpufleet.method", str)
METHOD = web.RequestKey("gpufleet.api_method", Method)
PRINCIPAL = web.RequestKey("gpufleet.principal", Principal)
INPUT = web.RequestKey("gpufleet.input", object)
ERROR_CODE = web.RequestKey("gpufleet.error_code", str)


@web.middleware
async def access(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """An access line for every request, an audit line for every write or admin call."""
    started = time.perf_counter()
    status: int = 500
    code: str | None = "INTERNAL"
    try:
        response = await handler(request)
        status, code = response.status, request.get(ERROR_CODE)
        return response
    except web.HTTPException as exc:
        status, code = exc.status, None
        raise
    finally:
        method = request.get(METHOD)
        principal = request.get(PRINCIPAL)
        audit.log_access(
            request.method, request.path, method, principal, status, code,
            (time.perf_counter() - started) * 1000,
        )  # fmt: skip
        if method is not None and audit.audited(method):
            audit.log_audit(method, principal, request.get(INPUT), status, code)


@web.middleware
async def latency(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    started = time.perf_counter()
    response = await handler(request)
    label = request.get(METHOD_LABEL)
    if label is not None:
        request.app[SERVICES].metrics.observe_api(
            label, response.status, time.perf_counter() - started
        )
    return response


@web.middleware
async def error_envelope(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except CoordinatorError as exc:
        request[ERROR_CODE] = exc.code
        return web.json_response(error_body(exc.code, exc.message, exc.details), status=exc.status)
    except web.HTTPException as exc:
        if exc.status == 413:
            return web.json_response(
                error_body("PAYLOAD_TOO_LARGE", "request body too large", {}), status=413
            )
        if exc.status == 405:
            allowed = exc.headers.get("Allow", "")
            return web.json_response(
                error_body(
                    "METHOD_NOT_ALLOWED",
                    f"{request.method} is not allowed on {request.path}",
                    {"allow": [m for m in allowed.split(",") if m]},
                ),
                status=405,
                headers={"Allow": allowed},
            )
        if exc.status == 404:
            return web.json_response(
                error_body("NOT_FOUND", f"no route {request.method} {request.path}", {}),
                status=404,
            )
        raise
    except Exception:
        log.exception("unhandled error in %s %s", request.method, request.path)
        request[ERROR_CODE] = "INTERNAL"
        return web.json_response(error_body("INTERNAL", "internal error", {}), status=500)


async def _read_body(request: web.Request) -> bytes:
    limits = request.app[LIMITS]
    try:
        return await read_whole(
            request.content, request.content_length, MAX_BODY_BYTES, limits.body_timeout_s
        )
    except TooLarge as exc:
        raise PayloadTooLarge(str(exc)) from None
    except TooSlow as exc:
        raise RequestTimeout(str(exc)) from None


def _decode(method: Method, request: web.Request, raw: bytes) -> Any:
    if method.convention == "compute":
        try:
            strict_json(raw or b"{}")
            return method.input.model_validate_json(raw or b"{}")
        except BodyError as exc:
            fields = [{"path": "(body)", "message": str(exc)}]
            raise InvalidInput(str(exc), {"fields": fields}) from None
        except ValidationError as exc:
            raise invalid_input(exc) from None
    assert issubclass(method.input, RestInput)
    values: dict[str, Any] = {}
    for field in method.input.model_fields.values():
        name = field.alias or ""
        source = where(field)
        if source == "body":
            values[name] = raw
            continue
        value = request.headers.get(name) if source == "header" else request.query.get(name)
        if value is not None:
            try:
                check_text(value, name)
            except BodyError as exc:
                raise IntervalError(str(exc)) from None
        values[name] = value
    return method.input.model_validate(values)


def _seed_answer(exc: Exception) -> web.Response | None:
    """The `seed-002` convention's words for what went wrong (None: the envelope's)."""
    if isinstance(exc, IntervalError):
        return web.Response(status=400, text=f"{exc}\n", content_type="text/plain")
    if isinstance(exc, InvalidInput) and exc.status == 400:
        return web.Response(status=400, text=f"{exc.message}\n", content_type="text/plain")
    if isinstance(exc, NotFound):
        return web.Response(status=404, text=f"{exc.message}\n", content_type="text/plain")
    if isinstance(exc, IdempotencyKeyConflict):
        body = IdempotencyConflictBody(error="idempotency_key_conflict", message=exc.message)
        return json_answer(body, 409)
    return None


def _endpoint(method: Method) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def endpoint(request: web.Request) -> web.StreamResponse:
        request[METHOD_LABEL] = method.label
        request[METHOD] = method
        services = request.app[SERVICES]
        key = bearer_key(request.headers.get("Authorization"), request.headers.get("X-API-Key"))
        principal = await authenticate(services.ledger, key)
        request[PRINCIPAL] = principal
        reads_body = method.verb == "POST"
        if method.convention == "compute":
            raw = await _read_body(request)
            body = _decode(method, request, raw)
            request[INPUT] = body
            pool = await authorize(method, principal, body, services.ledger)
        else:
            # The seed's order: permission first, then the request's own rules.
            pool = await authorize(method, principal, method.input(), services.ledger)
        try:
            if method.convention != "compute":
                raw = await _read_body(request) if reads_body else b""
                body = _decode(method, request, raw)
                request[INPUT] = body
            result = await method.handler(CallContext(principal, services, pool), body)
        except (IntervalError, CoordinatorError) as exc:
            answer = _seed_answer(exc) if method.convention == "seed-002" else None
            if answer is None:
                raise
            request[ERROR_CODE] = getattr(exc, "code", "INVALID_INPUT")
            return answer
        if isinstance(result, Streamed):
            return await _stream(request, result)
        if isinstance(result, Reply):
            if isinstance(result.body, dict) and isinstance(result.body.get("error"), dict):
                request[ERROR_CODE] = str(result.body["error"].get("code"))
            if isinstance(result.body, str):
                return web.Response(
                    status=result.status, text=result.body, content_type="text/plain"
                )
            return json_answer(result.body, result.status)
        return json_answer(result)

    return endpoint


async def _stream(request: web.Request, answer: Streamed) -> web.StreamResponse:
    """Write an export as it is made: memory holds one chunk, not the whole answer."""
    resp = web.StreamResponse(
        headers={
            "Content-Type": f"{answer.content_type}; charset=utf-8",
            "Content-Disposition": f'attachment; filename="{answer.filename}"',
        }
    )
    await resp.prepare(request)
    for chunk in answer.chunks:
        await resp.write(chunk)
    await resp.write_eof()
    return resp


def json_answer(body: Any, status: int = 200) -> web.Response:
    """Every successful answer, serialized by orjson: a page of 1,000 nodes or a node with
    its atoms is several times faster than with json (bench/README.md). What orjson
    refuses (an integer beyond 64 bits) goes through json. A handler's output model is
    dumped first: its one declaration is the answer's shape (`Prebuilt` answers were
    built with its keys)."""
    if isinstance(body, ApiOutput):
        body = dump(body)
    elif isinstance(body, Prebuilt):
        body = body.body
    try:
        raw = orjson.dumps(body, option=orjson.OPT_NON_STR_KEYS)
    except TypeError:
        raw = json.dumps(body).encode()
    return web.Response(body=raw, status=status, content_type="application/json")


async def _security_headers(_: web.Request, response: web.StreamResponse) -> None:
    # Runs after aiohttp has filled in its defaults: its `Server: Python/… aiohttp/…` is
    # replaced; a handler's own Cache-Control (none today) would be kept.
    for name, value in SECURITY_HEADERS.items():
        if name == "Server" or name not in response.headers:
            response.headers[name] = value


def _metrics_handler(
    services: Services, token: str | None, *, open_listener: bool
) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def metrics(request: web.Request) -> web.Response:
        if not (open_listener and token is None):
            try:
                given: str | None = bearer_key(request.headers.get("Authorization"), None)
            except Unauthenticated:
                given = None
            allowed = given is not None and (
                (token is not None and hmac.compare_digest(given.encode(), token.encode()))
                or _reads_metrics(await services.ledger.keys.authenticate(given))
            )
            if not allowed:
                return web.json_response(
                    error_body(
                        "UNAUTHENTICATED", "/metrics needs its token or an operator/observer key"
                    ),
                    status=401,
                    headers={"WWW-Authenticate": "Bearer"},
                )
        # A follower's scrape carries no fleet series (the leader's), so no census read.
        census = None
        if services.metrics.exports_fleet():
            census = await services.ledger.census(services.clock.now_ms())
        body = services.metrics.render(census)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    return metrics


def _reads_metrics(principal: Principal | None) -> bool:
    return principal is not None and principal.reads_every_tenant


def metrics_app(services: Services, limits: HttpLimits) -> web.Application:
    """`/metrics` alone, for a listener of its own (`metrics_port`); the token, when set,
    is still required there."""
    app = web.Application()
    app.on_response_prepare.append(_security_headers)
    handler = _metrics_handler(services, limits.metrics_token, open_listener=True)
    app.router.add_get("/metrics", handler)
    return app


def build_app(
    services: Services, registry: Registry, limits: HttpLimits | None = None
) -> web.Application:
    """The API serving `registry`'s methods (`coordinator.api.app` mounts them all)."""
    limits = limits or HttpLimits()
    # latency wraps the envelope, so it sees the status an error was turned into.
    app = web.Application(
        middlewares=[latency, access, error_envelope], client_max_size=MAX_BODY_BYTES
    )
    app[SERVICES] = services
    app[LIMITS] = limits
    app.on_response_prepare.append(_security_headers)
    for method in registry:
        app.router.add_route(method.verb, method.path, _endpoint(method))
    document = build_openapi(registry, "0.1.0")
    openapi_text = json.dumps(document)

    async def openapi(_: web.Request) -> web.Response:
        return web.Response(text=openapi_text, content_type="application/json")

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app.router.add_get("/api/openapi.json", openapi)
    if limits.metrics_on_api:
        app.router.add_get(
            "/metrics", _metrics_handler(services, limits.metrics_token, open_listener=False)
        )
    app.router.add_get("/healthz", healthz)

    # Web console, API reference and the console's alert feed (coordinator/api/http/console.py).
    add_console_routes(app, services)
    return app


SHUTDOWN_GRACE_S = 5.0


class HttpServer:
    """The API on a TCP socket; port 0 picks a free one (see `.port` after start)."""

    def __init__(
        self, app: web.Application, host: str, port: int, idle_timeout_s: float = 15.0
    ) -> None:
        # keepalive_timeout is armed when a connection opens and after each answer: a
        # client that sends no complete request header within it is closed.
        # shutdown_timeout: handlers still running at shutdown (a create waiting for room)
        # get this long, then are cancelled; their clients retry under their keys.
        self._runner = web.AppRunner(
            app,
            access_log=None,
            keepalive_timeout=idle_timeout_s,
            max_field_size=8190,
            shutdown_timeout=SHUTDOWN_GRACE_S,
        )
        self.host = host
        self.port = port

    @property
    def app(self) -> web.Application:
        """The application served (its services: `app[SERVICES]`)."""
        return self._runner.app

    async def start(self) -> None:
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True, backlog=1024)
        await site.start()
        sockets = self._runner.addresses
        if sockets:
            self.port = int(sockets[0][1])

    async def stop(self) -> None:
        await self._runner.cleanup()
