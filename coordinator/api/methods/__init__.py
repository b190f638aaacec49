"""Importing this module registers every API method in `REGISTRY` (no aiohttp here, so
the OpenAPI document and the docs table can be built without a server)."""

from __future__ import annotations

from coordinator.api.http.registry import REGISTRY
from coordinator.api.methods import (
    admin,
    capacity,
    consumption,
    gpus,
    hardware,
    intervals,
    nodes,
    pools,
    projects,
    reservations,
    usage,
)

__all__ = [
    "REGISTRY",
    "admin",
    "capacity",
    "consumption",
    "gpus",
    "hardware",
    "intervals",
    "nodes",
    "pools",
    "projects",
    "reservations",
    "usage",
]
