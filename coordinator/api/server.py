"""aiohttp application: routes generated from the registry, authentication, body
validation, and the one place where errors become the `{"error": …}` envelope."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web
from pydantic import ValidationError

from coordinator.api import audit
from coordinator.api.auth import authenticate, authorize, bearer_key
from coordinator.api.context import CallContext, Services
from coordinator.api.methods import REGISTRY
from coordinator.api.openapi import build_openapi
from coordinator.api.registry import Method, Registry, Reply, RestInput, where
from coordinator.api.render import error_body
from coordinator.domain.intervals import IntervalError
from coordinator.domain.model import Principal
from coordinator.errors import (
    CoordinatorError,
    IdempotencyKeyConflict,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
)
from coordinator.metrics import CONTENT_TYPE

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 1024 * 1024
SERVICES = web.AppKey("services", Services)


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
        if exc.status in (404, 405):
            return web.json_response(
                error_body("NOT_FOUND", f"no route {request.method} {request.path}", {}),
                status=exc.status,
            )
        raise
    except Exception:
        log.exception("unhandled error in %s %s", request.method, request.path)
        request[ERROR_CODE] = "INTERNAL"
        return web.json_response(error_body("INTERNAL", "internal error", {}), status=500)


async def _read_body(request: web.Request) -> bytes:
    if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
        raise PayloadTooLarge(f"request body is over {MAX_BODY_BYTES} bytes")
    body = await request.content.read(MAX_BODY_BYTES + 1)
    if len(body) > MAX_BODY_BYTES:
        raise PayloadTooLarge(f"request body is over {MAX_BODY_BYTES} bytes")
    return body


def _decode(method: Method, request: web.Request, raw: bytes) -> Any:
    if method.convention == "compute":
        try:
            return method.input.model_validate_json(raw or b"{}")
        except ValidationError as exc:
            raise invalid_input(exc) from None
    assert issubclass(method.input, RestInput)
    values: dict[str, Any] = {}
    for field in method.input.model_fields.values():
        name = field.alias or ""
        source = where(field)
        if source == "body":
            values[name] = raw
        elif source == "header":
            values[name] = request.headers.get(name)
        else:
            values[name] = request.query.get(name)
    return method.input.model_validate(values)


def _seed_answer(exc: Exception) -> web.Response | None:
    """The `seed-002` convention's words for what went wrong (None: the envelope's)."""
    if isinstance(exc, IntervalError):
        return web.Response(status=400, text=f"{exc}\n", content_type="text/plain")
    if isinstance(exc, NotFound):
        return web.Response(status=404, text=f"{exc.message}\n", content_type="text/plain")
    if isinstance(exc, IdempotencyKeyConflict):
        body = {"error": "idempotency_key_conflict", "message": exc.message}
        return web.json_response(body, status=409)
    return None


def _endpoint(method: Method) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def endpoint(request: web.Request) -> web.Response:
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
            raw = await _read_body(request) if reads_body else b""
            body = _decode(method, request, raw)
            request[INPUT] = body
        try:
            result = await method.handler(CallContext(principal, services, pool), body)
        except (IntervalError, CoordinatorError) as exc:
            answer = _seed_answer(exc) if method.convention == "seed-002" else None
            if answer is None:
                raise
            request[ERROR_CODE] = getattr(exc, "code", "INVALID_INPUT")
            return answer
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


def json_answer(body: Any, status: int = 200) -> web.Response:
    """Every successful answer, serialized by orjson: a page of 1,000 nodes or a node with
    its atoms is several times faster than with json (bench/README.md). What orjson
    refuses (an integer beyond 64 bits) goes through json."""
    try:
        raw = orjson.dumps(body, option=orjson.OPT_NON_STR_KEYS)
    except TypeError:
        raw = json.dumps(body).encode()
    return web.Response(body=raw, status=status, content_type="application/json")


def build_app(services: Services, registry: Registry = REGISTRY) -> web.Application:
    # latency wraps the envelope, so it sees the status an error was turned into.
    app = web.Application(
        middlewares=[latency, access, error_envelope], client_max_size=MAX_BODY_BYTES
    )
    app[SERVICES] = services
    for method in registry:
        app.router.add_route(method.verb, method.path, _endpoint(method))
    document = build_openapi(registry, "0.1.0")
    openapi_text = json.dumps(document)

    async def openapi(_: web.Request) -> web.Response:
        return web.Response(text=openapi_text, content_type="application/json")

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def metrics(_: web.Request) -> web.Response:
        pools = [p.pool_id for p in await services.ledger.pools.list_all()]
        body = services.metrics.render(await services.ledger.rollup(pools))
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    app.router.add_get("/api/openapi.json", openapi)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    return app


class HttpServer:
    """The API on a TCP socket; port 0 picks a free one (see `.port` after start)."""

    def __init__(self, app: web.Application, host: str, port: int) -> None:
        self._runner = web.AppRunner(app, access_log=None)
        self.host = host
        self.port = port

    async def start(self) -> None:
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        await site.start()
        sockets = self._runner.addresses
        if sockets:
            self.port = int(sockets[0][1])

    async def stop(self) -> None:
        await self._runner.cleanup()
