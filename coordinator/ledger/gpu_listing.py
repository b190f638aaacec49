"""The fleet's GPU units a page at a time (`gpus.list`): every current GPU, MIG instance
and time-slice slot atom with its node, and the bookings holding the page's nodes now.

Two statements a page whatever the fleet's size (atoms joined with their nodes, then the
live bookings of the nodes on the page), where asking `nodes.get` of each node cost one
request and three statements a node. The pool, node, label and model filters are SQL;
the state filter is the caller's (a state depends on the holder and on use), so a page
asked with one reads every unit after the cursor (`limit=None`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from sqlalchemy import ColumnElement, Row, and_, func, or_, select
from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.domain.gpu_use_units import GPU_CLASSES, unit_of
from coordinator.domain.model import AtomRecord, Holder, NodeRecord
from coordinator.ledger import schema
from coordinator.ledger.bulk import among
from coordinator.ledger.catalog import NODE_COLUMNS, node_record
from coordinator.ledger.database import Database


@dataclass(frozen=True, slots=True)
class GpuFilter:
    """Which units: of these pools (required), one node, nodes with every label, a model
    containing any of `models` (any case)."""

    pool_ids: Sequence[str]
    node_id: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    models: Sequence[str] = ()


@dataclass(frozen=True, slots=True)
class NodeHold:
    """A booking running now on a listed node: the atom it holds and by whom."""

    node_id: str
    atom_id: str
    cls: str
    holder: Holder
    unit: str | None  # the GPU unit a GPU-class atom is (None: another class)


@dataclass(frozen=True, slots=True)
class ListedUnit:
    node: NodeRecord  # without its atoms
    atom: AtomRecord


@dataclass(frozen=True, slots=True)
class GpuRows:
    """Units by (nodeId, atomId), each with its node, and the live bookings of their nodes
    (whole-node ones included: they cover every unit, and use shows by holder)."""

    units: list[ListedUnit]
    holds: list[NodeHold]


class GpuListing:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def page(
        self, wanted: GpuFilter, after: tuple[str, str] | None, limit: int | None, now: int
    ) -> GpuRows:
        """The units `wanted` picks after the (nodeId, atomId) `after`, at most `limit`
        (None: all), and the bookings holding their nodes' atoms at `now`."""
        n, a = schema.nodes.c, schema.atoms.c
        async with self._db.read() as conn:
            cond: ColumnElement[bool] = and_(
                among(conn, n.pool_id, wanted.pool_ids),
                a.retired.is_(False),
                a["class"].in_(sorted(GPU_CLASSES)),
            )
            if wanted.node_id is not None:
                cond = cond & (n.node_id == wanted.node_id)
            for key, value in sorted(wanted.labels.items()):
                cond = cond & (n.labels[key].as_string() == value)
            if wanted.models:
                model = func.lower(a.attrs["model"].as_string())
                cond = cond & or_(*(model.contains(m.lower(), autoescape=True)
                                    for m in wanted.models))  # fmt: skip
            if after is not None:
                cond = cond & or_(
                    n.node_id > after[0], (n.node_id == after[0]) & (a.atom_id > after[1])
                )
            query = (
                select(*NODE_COLUMNS, a.atom_id, a["class"].label("cls"), a.device_id,
                       a.health.label("atom_health"), a.health_reasons.label("atom_reasons"),
                       a.attrs)
                .select_from(schema.atoms.join(schema.nodes, n.node_id == a.node_id))
                .where(cond)
                .order_by(n.node_id, a.atom_id)
            )  # fmt: skip
            if limit is not None:
                query = query.limit(limit)
            rows = (await conn.execute(query)).all()
            nodes: dict[str, NodeRecord] = {}
            units = []
            for r in rows:
                node = nodes.get(r.node_id)
                if node is None:
                    node = nodes[r.node_id] = node_record(cast("Row[Any]", r))
                atom = AtomRecord(r.atom_id, r.cls, r.device_id, r.atom_health,
                                  tuple(r.atom_reasons or ()), dict(r.attrs or {}))  # fmt: skip
                units.append(ListedUnit(node, atom))
            holds = await _holds(conn, list(nodes), now) if nodes else []
        return GpuRows(units, holds)


async def _holds(conn: AsyncConnection, node_ids: list[str], now: int) -> list[NodeHold]:
    b, a, rv = schema.bookings.c, schema.atoms.c, schema.reservations.c
    rows = await conn.execute(
        select(b.node_id, b.atom_id, b["class"].label("cls"), b.reservation_id, b.tenant_id,
               rv.project_id, b.end, a.device_id, a.attrs)
        .select_from(
            schema.bookings.outerjoin(schema.reservations, rv.reservation_id == b.reservation_id)
            .outerjoin(schema.atoms, a.atom_id == b.atom_id)
        )
        .where(among(conn, b.node_id, node_ids) & (b.start <= now) & (b.end > now))
    )  # fmt: skip
    return [
        NodeHold(
            r.node_id, r.atom_id, r.cls,
            Holder(r.reservation_id, r.tenant_id, r.project_id, int(r.end)),
            unit_of(r.cls, r.atom_id, r.device_id, r.attrs or {})
            if r.cls in GPU_CLASSES and r.device_id is not None else None,
        )
        for r in rows.all()
    ]  # fmt: skip
