"""The mount: the HTTP server with every method of `methods/` registered. The one place
above both groups, so `http/` never imports `methods/`."""

from __future__ import annotations

from aiohttp import web

from coordinator.api.http import server
from coordinator.api.http.context import Services
from coordinator.api.methods import REGISTRY


def build_app(services: Services, limits: server.HttpLimits | None = None) -> web.Application:
    return server.build_app(services, REGISTRY, limits)
