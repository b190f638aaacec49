"""Reservations' at-risk flags, kept in step with the nodes and devices they hold.

Every node change (`NodeRepo.change`) ends by re-judging the live reservations with a
booking on the touched nodes (`coordinator.domain.risk`), in the same transaction, and
stores the flag on the reservation row, so every answer carries it and the holder can
be told exactly once when it is set and once when it clears.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import bindparam, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.domain.model import NodeState
from coordinator.domain.reservation import LIVE, AtRisk
from coordinator.domain.risk import AtomCondition, RiskChange, assess, atom_risk
from coordinator.domain.transitions import POOL_CHANGE_PENDING
from coordinator.ledger import schema


def at_risk_from_json(value: Any) -> AtRisk | None:
    if not value:
        return None
    return AtRisk(str(value["reason"]), int(value["since"]), tuple(value["atoms"]))


def at_risk_json(risk: AtRisk | None) -> dict[str, Any] | None:
    if risk is None:
        return None
    return {"reason": risk.reason, "since": risk.since, "atoms": list(risk.atoms)}


async def refresh_risk(conn: AsyncConnection, node_ids: list[str], now: int) -> list[RiskChange]:
    """Re-judge the live reservations booked on `node_ids`; returns those that became
    at risk or recovered (a changed reason or set of atoms is stored, not announced)."""
    b, rv, n, a = schema.bookings.c, schema.reservations.c, schema.nodes.c, schema.atoms.c
    live = (b.end > now) & (b.end > b.start)
    on_nodes = select(b.reservation_id).distinct().where(b.node_id.in_(node_ids) & live)
    rids = (await conn.execute(on_nodes)).scalars().all()
    if not rids:
        return []
    booked = (
        await conn.execute(
            select(b.reservation_id, b.atom_id, b.node_id).where(b.reservation_id.in_(rids) & live)
        )
    ).all()
    reservations = (
        await conn.execute(
            select(rv.reservation_id, rv.tenant_id, rv.pool_id, rv.at_risk).where(
                rv.reservation_id.in_(rids) & (rv.state == LIVE)
            )
        )
    ).all()
    nodes = {
        row.node_id: row
        for row in (
            await conn.execute(
                select(
                    n.node_id, n.reachable, n.health, n.maintenance, n.provisioning,
                    n.maintenance_reason, n.pending_pool_id, n.shape_hold,
                ).where(n.node_id.in_({r.node_id for r in booked}))
            )
        ).all()
    }  # fmt: skip
    atoms = {
        row.atom_id: row
        for row in (
            await conn.execute(
                select(a.atom_id, a.health, a.retired).where(
                    a.atom_id.in_({r.atom_id for r in booked})
                )
            )
        ).all()
    }
    per_reservation: dict[str, dict[str, str | None]] = {}
    node_of: dict[str, str] = {}
    for row in booked:
        node_of[row.atom_id] = row.node_id
        per_reservation.setdefault(row.reservation_id, {})[row.atom_id] = _reason(
            nodes.get(row.node_id), atoms.get(row.atom_id)
        )
    changes: list[RiskChange] = []
    writes: list[dict[str, Any]] = []
    for res in reservations:
        before = at_risk_from_json(res.at_risk)
        after = assess(per_reservation.get(res.reservation_id, {}), before, now)
        if after == before:
            continue
        writes.append({"b_id": res.reservation_id, "b_risk": at_risk_json(after)})
        if (before is None) != (after is None):
            subject = (after or before).atoms  # type: ignore[union-attr]
            node_id = next((node_of[x] for x in subject if x in node_of), node_ids[0])
            changes.append(
                RiskChange(res.reservation_id, res.tenant_id, res.pool_id, node_id, after, before)
            )
    if writes:
        await conn.execute(
            update(schema.reservations)
            .where(rv.reservation_id == bindparam("b_id"))
            .values(at_risk=bindparam("b_risk"), updated_at=now),
            writes,
        )
    return changes


def _reason(node: Any, atom: Any) -> str | None:
    if node is None:
        return None
    state = NodeState(
        reachable=bool(node.reachable),
        health=node.health,
        maintenance=bool(node.maintenance),
        provisioning=bool(node.provisioning),
    )
    held = node.pending_pool_id is not None and node.maintenance_reason == POOL_CHANGE_PENDING
    return atom_risk(
        AtomCondition(
            node=state,
            held_for_pool_change=held,
            health=atom.health if atom is not None else "healthy",
            retired=atom is None or bool(atom.retired),
            held_for_shape=bool(node.shape_hold),
        )
    )
