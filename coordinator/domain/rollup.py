"""Rollup math: one row per (pool, resource) from the nodes, their atoms and bookings.

`total = allocatable + provisioning + unhealthy + maintenance + unreachable` always holds
because every atom or scalar unit is put in exactly one bucket. `available` is
conservative: `max(0, allocatable - allocated - reserved)`.
"""

from __future__ import annotations

from collections.abc import Iterable

from coordinator.domain.model import (
    RESOURCES,
    ROLLUP_BUCKETS,
    SCALAR_RESOURCES,
    BookedUnits,
    NodeView,
    RollupRow,
)
from coordinator.domain.states import atom_bucket, node_bucket


def compute_rollup(
    nodes: Iterable[NodeView], booked: BookedUnits | None, now_ms: int
) -> dict[str, RollupRow]:
    """Rows for every resource of one pool (all nine, zeros included)."""
    counts: dict[str, dict[str, int]] = {r: dict.fromkeys(ROLLUP_BUCKETS, 0) for r in RESOURCES}
    for node in nodes:
        for atom in node.atoms:
            counts[atom.cls][atom_bucket(node.state, atom)] += 1
        bucket = node_bucket(node.state)
        for resource in SCALAR_RESOURCES:
            counts[resource][bucket] += node.scalar(resource)
    booked = booked or BookedUnits()
    rows: dict[str, RollupRow] = {}
    for resource in RESOURCES:
        c = counts[resource]
        allocated = booked.allocated.get(resource, 0)
        reserved = booked.reserved.get(resource, 0)
        rows[resource] = RollupRow(
            resource=resource,
            total=sum(c.values()),
            allocatable=c["allocatable"],
            allocated=allocated,
            reserved=reserved,
            available=max(0, c["allocatable"] - allocated - reserved),
            provisioning=c["provisioning"],
            unhealthy=c["unhealthy"],
            maintenance=c["maintenance"],
            unreachable=c["unreachable"],
            updated_at=now_ms,
        )
    return rows


def sum_rows(rows: Iterable[RollupRow], resource: str) -> RollupRow:
    """Column-wise sum (used for byGpuModel); `updatedAt` is the newest of the inputs."""
    total = allocatable = allocated = reserved = available = 0
    prov = unhealthy = maint = unreach = updated = 0
    for r in rows:
        total += r.total
        allocatable += r.allocatable
        allocated += r.allocated
        reserved += r.reserved
        available += r.available
        prov += r.provisioning
        unhealthy += r.unhealthy
        maint += r.maintenance
        unreach += r.unreachable
        updated = max(updated, r.updated_at)
    return RollupRow(
        resource, total, allocatable, allocated, reserved, available,
        prov, unhealthy, maint, unreach, updated,
    )  # fmt: skip


# Columns that depend only on nodes and atoms (bookings move allocated/reserved).
STATE_COLUMNS: tuple[str, ...] = ("total", *ROLLUP_BUCKETS)
Delta = dict[str, dict[str, int]]  # resource → column → change


def contribution(node: NodeView) -> Delta:
    """What one node adds to its pool's rows: per resource, `total` and each bucket."""
    out: Delta = {}
    for atom in node.atoms:
        col = out.setdefault(atom.cls, {})
        bucket = atom_bucket(node.state, atom)
        col[bucket] = col.get(bucket, 0) + 1
        col["total"] = col.get("total", 0) + 1
    bucket = node_bucket(node.state)
    for resource in SCALAR_RESOURCES:
        amount = node.scalar(resource)
        if amount:
            out[resource] = {bucket: amount, "total": amount}
    return out


def rollup_delta(before: NodeView | None, after: NodeView | None) -> Delta:
    """The change to a pool's rows when one node goes from `before` to `after` (either
    may be None: a new node, a removed node). Both must be in the same pool."""
    delta: Delta = {}
    for sign, node in ((-1, before), (1, after)):
        if node is None:
            continue
        for resource, cols in contribution(node).items():
            target = delta.setdefault(resource, {})
            for col, n in cols.items():
                target[col] = target.get(col, 0) + sign * n
    return {
        r: {c: n for c, n in cols.items() if n} for r, cols in delta.items() if any(cols.values())
    }


def apply_delta(rows: dict[str, RollupRow], delta: Delta, now_ms: int) -> dict[str, RollupRow]:
    """Pure twin of the ledger's SQL update: add the delta, recompute `available`."""
    out = dict(rows)
    for resource, cols in delta.items():
        row = out[resource]
        values = {c: getattr(row, c) + cols.get(c, 0) for c in STATE_COLUMNS}
        available = max(0, values["allocatable"] - row.allocated - row.reserved)
        out[resource] = RollupRow(
            resource=resource,
            allocated=row.allocated,
            reserved=row.reserved,
            available=available,
            updated_at=now_ms,
            **values,
        )
    return out
