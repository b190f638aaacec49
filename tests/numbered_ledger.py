"""A ledger database as the numbered migrations (before Alembic) left it, at any of their
steps v1..v5, built from the frozen DDL in `fixtures/`, and filled with one row set that
touches every table and column kind (JSON, booleans, nullable, autoincrement keys).

Rows go in through reflected tables, never through `coordinator.ledger.schema`: the
fixture must stay what those databases were, whatever the schema module becomes.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, MetaData, Table, inspect, select

FIXTURES = Path(__file__).parent / "fixtures"

# Table → rows, in foreign-key order; autoincrement keys are left to the database.
ROWS: dict[str, list[dict[str, Any]]] = {
    "tenants": [
        {"tenant_id": "acme", "name": "Acme", "created_at": 1},
        {"tenant_id": "beta", "name": "Beta Ltd", "created_at": 2},
    ],
    "api_keys": [
        {
            "key_id": "k1",
            "tenant_id": "acme",
            "key_hash": "a" * 64,
            "roles": "admin,booker",
            "label": "ci",
            "created_at": 3,
            "revoked_at": None,
        },
        {
            "key_id": "k2",
            "tenant_id": "beta",
            "key_hash": "b" * 64,
            "roles": "viewer",
            "label": "",
            "created_at": 4,
            "revoked_at": 99,
        },
    ],
    "pools": [
        {
            "pool_id": "pool-1",
            "name": "h100s",
            "owner": "acme",
            "gpu_model": "H100",
            "archived": False,
            "created_at": 5,
        },
        {
            "pool_id": "pool-2",
            "name": "old",
            "owner": "acme",
            "gpu_model": None,
            "archived": True,
            "created_at": 6,
        },
    ],
    "pool_offers": [{"pool_id": "pool-1", "tenant_id": "beta", "created_at": 7}],
    "nodes": [
        {
            "node_id": "n1",
            "pool_id": "pool-1",
            "hostname": "gpu-01",
            "boot_id": "boot-1",
            "labels": {"rack": "r1", "zone": "a"},
            "profile_id": "h100-sxm",
            "profile_version": 3,
            "inventory_hash": "h1",
            "inventory": {"gpus": [{"uuid": "GPU-1", "memoryMiB": 81920}], "vcpu": 64},
            "interval_ms": 5000,
            "last_seen": 1000,
            "reachable": True,
            "reachable_since": 900,
            "health": "degraded",
            "health_reasons": ["xid 79"],
            "health_since": 950,
            "maintenance": True,
            "maintenance_reason": "swap PSU",
            "maintenance_by": "ops:alice",
            "maintenance_since": 960,
            "provisioning": False,
            "vcpu": 64,
            "memory_gib": 512,
            "hugepages_1gi": 16,
            "created_at": 8,
            "updated_at": 1000,
        },
        {
            "node_id": "n2",
            "pool_id": "pool-2",
            "hostname": "",
            "boot_id": "",
            "labels": {},
            "profile_id": None,
            "profile_version": None,
            "inventory_hash": "",
            "inventory": None,
            "interval_ms": 2000,
            "last_seen": 10,
            "reachable": False,
            "reachable_since": 10,
            "health": "healthy",
            "health_reasons": [],
            "health_since": 10,
            "maintenance": False,
            "maintenance_reason": "",
            "maintenance_by": "",
            "maintenance_since": None,
            "provisioning": True,
            "vcpu": 0,
            "memory_gib": 0,
            "hugepages_1gi": 0,
            "created_at": 9,
            "updated_at": 10,
        },
    ],
    "atoms": [
        {
            "atom_id": f"n1/gpu/{i}",
            "node_id": "n1",
            "pool_id": "pool-1",
            "class": "gpu",
            "device_id": f"GPU-{i}",
            "attrs": {"memoryMiB": 81920, "index": i},
            "health": "healthy" if i else "unhealthy",
            "health_reasons": [] if i else ["xid 79"],
            "retired": i == 2,
        }
        for i in range(3)
    ],
    "node_events": [
        {
            "node_id": "n1",
            "pool_id": "pool-1",
            "kind": "node.registered",
            "reason": "",
            "by": "coordinator",
            "at": 8,
            "device_id": None,
        },
        {
            "node_id": "n1",
            "pool_id": "pool-1",
            "kind": "node.maintenance",
            "reason": "swap PSU",
            "by": "ops:alice",
            "at": 960,
            "device_id": "GPU-0",
        },
    ],
    "rollup": [
        {
            "pool_id": "pool-1",
            "resource": "gpu",
            "total": 3,
            "allocatable": 2,
            "allocated": 1,
            "reserved": 1,
            "available": 0,
            "provisioning": 0,
            "unhealthy": 1,
            "maintenance": 0,
            "unreachable": 0,
            "updated_at": 1000,
        }
    ],
    # v2
    "quotas": [
        {"tenant_id": "acme", "pool_id": "", "resource": "gpu", "limit": 16, "updated_at": 11},
        {
            "tenant_id": "beta",
            "pool_id": "pool-1",
            "resource": "vcpu",
            "limit": 8,
            "updated_at": 12,
        },
    ],
    # v3
    "reservations": [
        {
            "reservation_id": "res-1",
            "tenant_id": "acme",
            "pool_id": "pool-1",
            "project_id": "proj-a",
            "state": "booked",
            "spot": False,
            "binding": "soft",
            "start": 1000,
            "end": 5000,
            "lease_seconds": 600,
            "lease_expires_at": 601000,
            "preempt_at": None,
            "resources": {"gpu": 2, "vcpu": 8},
            "gang": {"size": 2},
            "atoms": ["n1/gpu/0", "n1/gpu/1"],
            "created_at": 13,
            "updated_at": 14,
            "ended_at": None,
        },
        {
            "reservation_id": "res-2",
            "tenant_id": "beta",
            "pool_id": "pool-1",
            "project_id": None,
            "state": "released",
            "spot": True,
            "binding": "hard",
            "start": 100,
            "end": 200,
            "lease_seconds": None,
            "lease_expires_at": None,
            "preempt_at": 150,
            "resources": {"gpu": 1},
            "gang": None,
            "atoms": ["n1/gpu/1"],
            "created_at": 15,
            "updated_at": 200,
            "ended_at": 200,
        },
    ],
    "bookings": [
        {
            "reservation_id": "res-1",
            "tenant_id": "acme",
            "pool_id": "pool-1",
            "node_id": "n1",
            "atom_id": atom,
            "class": "gpu",
            "spot": False,
            "start": 1000,
            "end": 5000,
        }
        for atom in ("n1/gpu/0", "n1/gpu/1")
    ]
    + [
        {
            "reservation_id": "res-2",
            "tenant_id": "beta",
            "pool_id": "pool-1",
            "node_id": "n1",
            "atom_id": "n1/gpu/1",
            "class": "gpu",
            "spot": True,
            "start": 100,
            "end": 200,
        }
    ],
    "scalar_bookings": [
        {
            "reservation_id": "res-1",
            "tenant_id": "acme",
            "pool_id": "pool-1",
            "node_id": "n1",
            "resource": "vcpu",
            "amount": 8,
            "spot": False,
            "start": 1000,
            "end": 5000,
        }
    ],
    "idempotency": [
        {
            "tenant_id": "acme",
            "endpoint": "reservations.create",
            "key": "retry-1",
            "body_hash": "c" * 64,
            "status": 200,
            "response": {"reservation": {"reservationId": "res-1", "atoms": ["n1/gpu/0"]}},
            "created_at": 13,
        },
        {
            "tenant_id": "beta",
            "endpoint": "capacity.reservations",
            "key": "retry-2",
            "body_hash": "d" * 64,
            "status": 409,
            "response": {"reason": "insufficient capacity", "reservableGb": 12},
            "created_at": 16,
        },
    ],
    # v4
    "interval_reservations": [
        {
            "reservation_id": "ir-1",
            "tenant_id": "beta",
            "pool_id": "pool-1",
            "created_at": 17,
            "intervals": [{"start": "2026-01-01T00:00:00Z", "end": "2026-01-02T00:00:00Z"}],
        }
    ],
    # v5
    "pool_versions": [
        {"pool_id": "pool-1", "nodes_version": 3, "bookings_version": 7},
        {"pool_id": "pool-2", "nodes_version": 0, "bookings_version": 0},
    ],
}

# Interval reservations' quantities live in scalar_bookings (node "" , memoryGiB).
_INTERVAL_BOOKING = {
    "reservation_id": "ir-1",
    "tenant_id": "beta",
    "pool_id": "pool-1",
    "node_id": "",
    "resource": "memoryGiB",
    "amount": 12,
    "spot": False,
    "start": 1_767_225_600_000,
    "end": 1_767_312_000_000,
}


def statements(dialect: str, version: int) -> list[str]:
    """The frozen DDL of steps 1..`version` for `dialect`, one statement per item."""
    text = (FIXTURES / f"numbered_ledger.{dialect}.sql").read_text()
    sections = re.split(r"^-- version (\d+)$", text, flags=re.MULTILINE)
    out: list[str] = []
    for number, body in zip(sections[1::2], sections[2::2], strict=True):
        if int(number) <= version:
            out.extend(s.strip() for s in body.split(";\n") if s.strip())
    return out


def build(conn: Connection, version: int) -> None:
    for statement in statements(conn.dialect.name, version):
        conn.exec_driver_sql(statement)


def fill(conn: Connection) -> None:
    """Insert `ROWS` into whichever of its tables exist at this database's step."""
    metadata = MetaData()
    present = set(inspect(conn).get_table_names())
    for name, rows in ROWS.items():
        if name not in present:
            continue
        table = Table(name, metadata, autoload_with=conn)
        extra = (
            [_INTERVAL_BOOKING]
            if name == "scalar_bookings" and "interval_reservations" in present
            else []
        )
        conn.execute(table.insert(), rows + extra)


def dump(conn: Connection, names: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Every row of the named tables, ordered by primary key."""
    metadata = MetaData()
    out: dict[str, list[dict[str, Any]]] = {}
    for name in names:
        table = Table(name, metadata, autoload_with=conn)
        rows = conn.execute(select(table).order_by(*table.primary_key.columns)).mappings()
        out[name] = [dict(r) for r in rows]
    return out
