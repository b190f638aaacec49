"""Requests as tenants send them: `reservations.create` bodies of every shape the SPEC
names, turned into the workflow's `CreateRequest` exactly as the API does, and interval
reservation bodies on the quarter-hour grid."""

from __future__ import annotations

from typing import Any

from coordinator.api.methods.reservations import create_request as api_create_request
from coordinator.api.shapes.reservation_input import ReservationCreateInput
from coordinator.domain.intervals import format_time
from coordinator.services.reservations import CreateRequest

HOUR = 3_600_000
QUARTER = 900_000

# name → the body's shape-specific part, given a count (1..3).
SHAPES: dict[str, Any] = {
    "gpu": lambda n: {"devices": [{"class": "gpu", "count": n}]},
    # 2 or 3 GPUs in one clique: on a chain of bridges (`fleet.Links`) 0–1–2 has none of
    # three, and 0 and 2 free around a booked 1 are no pair.
    "gpu-nvlink": lambda n: {
        "devices": [{"class": "gpu", "count": max(n, 2)}],
        "topology": "nvlink-all",
    },
    "mig": lambda n: {"devices": [{"class": "gpu.mig", "count": min(n, 2)}]},
    "slot": lambda n: {"devices": [{"class": "gpu.slot", "count": n, "sharing": "timeslice"}]},
    "vf": lambda n: {"devices": [{"class": "nic.vf", "count": min(n, 2)}]},
    "disk": lambda n: {"devices": [{"class": "disk", "count": 1}]},
    "gpu+vf": lambda n: {
        "devices": [{"class": "gpu", "count": 1}, {"class": "nic.vf", "count": 1}]
    },
    "node": lambda n: {"devices": [{"class": "node", "count": 1}]},
    "binding-node": lambda n: {"devices": [{"class": "gpu", "count": 1}], "binding": "node"},
    "gang": lambda n: {
        "devices": [{"class": "gpu", "count": 1}],
        "gang": {"size": 2, "topologyKey": "rack"},
    },
    "gang-nodes": lambda n: {
        "devices": [{"class": "node", "count": 1}],
        "binding": "node",
        "gang": {"size": 2},
    },
}

RESOURCES: tuple[dict[str, int] | None, ...] = (
    None,
    None,
    {"vcpu": 4},
    {"memoryGiB": 16},
    {"vcpu": 2, "memoryGiB": 40},
)


def create_body(
    tenant_id: str,
    pool_id: str,
    key: str,
    shape: str,
    count: int,
    *,
    start: int | None,
    duration: str,
    spot: bool,
    lease_seconds: int | None,
    resources: dict[str, int] | None,
    wait_ms: int = 0,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "tenantId": tenant_id,
        "poolId": pool_id,
        "duration": duration,
        "idempotencyKey": key,
    } | SHAPES[shape](count)
    if start is not None:
        body["start"] = start
    if spot:
        body["spot"] = True
    if lease_seconds is not None:
        body["leaseSeconds"] = lease_seconds
    if resources and "binding" not in body:
        body["resources"] = resources
    if wait_ms:
        body["wait"] = {"timeoutMs": wait_ms}
    return body


def create_request(body: dict[str, Any]) -> CreateRequest:
    """What `POST /api/compute/reservations/create` hands the workflow for `body`."""
    return api_create_request(ReservationCreateInput.model_validate(body))


def interval_body(now: int, first: int, count: int, gb: int) -> dict[str, Any]:
    """`count` quarter-hours of `gb` from the `first`-th quarter after the lead time."""
    base = now - now % QUARTER + HOUR + first * QUARTER
    return {
        "intervals": [
            {
                "startsAt": format_time(base + k * QUARTER),
                "endsAt": format_time(base + (k + 1) * QUARTER),
                "capacityGb": gb,
            }
            for k in range(count)
        ]
    }
