"""The counted columns of a capacity rollup row, in the API's order: what the
coordinator's rollups store and `capacity.summary` answers, and what the CLI and the
demo print."""

from __future__ import annotations

COUNT_COLUMNS: tuple[str, ...] = (
    "total",
    "allocatable",
    "allocated",
    "reserved",
    "available",
    "provisioning",
    "unhealthy",
    "maintenance",
    "unreachable",
)
