"""Importing this module registers every API method in `REGISTRY` (no aiohttp here, so
the OpenAPI document and the docs table can be built without a server)."""

from __future__ import annotations

from coordinator.api import (
    admin,
    capacity,
    hardware,
    intervals,
    nodes,
    pools,
    reservations,
    usage,
)
from coordinator.api.registry import REGISTRY

__all__ = [
    "REGISTRY",
    "admin",
    "capacity",
    "hardware",
    "intervals",
    "nodes",
    "pools",
    "reservations",
    "usage",
]
