"""Pool-wide memory (interval reservations) in the ledger, kept true while nodes change:
what a pool's memory commitments are and which of its nodes have memory in service
(`read`), whether the pool still needs a node it is about to lose (`needs_node`), and
the interval reservations' at-risk flags, re-judged in the transaction of every node
change (`refresh_risk`) and announced exactly once each way, like those of compute
reservations (`ledger/risk.py`). The arithmetic is `coordinator.domain.pool_memory`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.domain import pool_memory
from coordinator.domain.commitments import Commitment
from coordinator.domain.model import NodeState
from coordinator.domain.pool_memory import OutOfService
from coordinator.domain.reservation import AtRisk
from coordinator.domain.risk import RiskChange
from coordinator.domain.transitions import POOL_CHANGE_PENDING
from coordinator.ledger import schema
from coordinator.ledger.database import Database
from coordinator.ledger.outbox import OutboxWriter
from coordinator.ledger.risk import at_risk_from_json, at_risk_json
from shared.wire import Alert

RESOURCE = "memoryGiB"


@dataclass(frozen=True, slots=True)
class PoolMemory:
    """One pool's memory as the ledger holds it from `now` on."""

    # reservationId → its pool-wide (interval) commitments that end after now.
    pool_wide: Mapping[str, tuple[Commitment, ...]]
    # nodeId → memory (GiB) of the nodes in service, and their node-level commitments.
    in_service: Mapping[str, int]
    node_level: Mapping[str, tuple[Commitment, ...]]
    out_of_service: tuple[OutOfService, ...]
    # nodeId → its `node` atom (what an at-risk flag names).
    node_atoms: Mapping[str, str]

    def commitments(self, without: str | None = None) -> list[Commitment]:
        """Pool-wide commitments and node-level ones on the nodes in service (but
        `without`): what the memory in service must cover."""
        out = [c for held in self.pool_wide.values() for c in held]
        out += [c for node, held in self.node_level.items() if node != without for c in held]
        return out

    def memory(self, without: str | None = None) -> int:
        return sum(gib for node, gib in self.in_service.items() if node != without)


async def read(conn: AsyncConnection, pool_id: str, now: int) -> PoolMemory:
    s, n, a = schema.scalar_bookings.c, schema.nodes.c, schema.atoms.c
    live = (s.pool_id == pool_id) & (s.resource == RESOURCE) & (s.end > now) & (s.end > s.start)
    rows = (
        await conn.execute(
            select(s.reservation_id, s.node_id, s.start, s.end, s.amount).where(live)
        )
    ).all()
    pool_wide: dict[str, list[Commitment]] = {}
    node_level: dict[str, list[Commitment]] = {}
    for rid, node_id, start, end, amount in rows:
        held = Commitment(int(start), int(end), int(amount))
        if node_id:
            node_level.setdefault(node_id, []).append(held)
        else:
            pool_wide.setdefault(rid, []).append(held)
    node_rows = (
        await conn.execute(
            select(
                n.node_id, n.reachable, n.health, n.maintenance, n.provisioning,
                n.maintenance_reason, n.pending_pool_id, n.shape_hold, n.memory_gib,
            ).where(n.pool_id == pool_id)
        )
    ).all()  # fmt: skip
    in_service: dict[str, int] = {}
    out: list[OutOfService] = []
    for row in node_rows:
        state = NodeState(
            reachable=bool(row.reachable),
            health=row.health,
            maintenance=bool(row.maintenance),
            provisioning=bool(row.provisioning),
        )
        moving = row.pending_pool_id is not None and row.maintenance_reason == POOL_CHANGE_PENDING
        reason = pool_memory.out_of_service(state, moving, bool(row.shape_hold))
        if reason is None:
            in_service[row.node_id] = int(row.memory_gib)
        elif row.memory_gib:
            out.append(OutOfService(row.node_id, reason))
    atoms: dict[str, str] = {}
    if out:
        atom_rows = await conn.execute(
            select(a.node_id, a.atom_id).where(
                (a.pool_id == pool_id) & (a["class"] == "node") & a.retired.is_(False)
            )
        )
        atoms = {node_id: atom_id for node_id, atom_id in atom_rows.all()}
    return PoolMemory(
        {rid: tuple(held) for rid, held in pool_wide.items()},
        in_service,
        {node: tuple(held) for node, held in node_level.items() if node in in_service},
        tuple(out),
        atoms,
    )


class PoolMemoryRisk:
    """The interval reservations' at-risk flags outside node changes: the clock moves
    them too (a quarter that was short ends; node-level memory is released)."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def rejudge(
        self,
        pool_ids: Iterable[str],
        now: int,
        alerts_of: Callable[[Sequence[RiskChange]], Sequence[Alert]],
    ) -> list[Alert]:
        """Re-judge the pools' interval reservations; the alerts of those that became at
        risk or recovered are written to the outbox in the same transaction."""
        async with self._db.transaction() as conn:
            risks = await refresh_risk(conn, pool_ids, {}, now)
            alerts = list(alerts_of(risks))
            await OutboxWriter(conn).add(alerts)
        return alerts


async def _promised(conn: AsyncConnection, pool_id: str, now: int) -> bool:
    """Whether the pool has a pool-wide commitment that ends after now (most have none:
    the cheap question first)."""
    s = schema.scalar_bookings.c
    found = await conn.execute(
        select(s.reservation_id)
        .where(
            (s.pool_id == pool_id) & (s.node_id == "") & (s.resource == RESOURCE)
            & (s.end > now) & (s.end > s.start)
        )
        .limit(1)
    )  # fmt: skip
    return found.first() is not None


async def needs_node(conn: AsyncConnection, pool_id: str, node_id: str, now: int) -> bool:
    """Whether `pool_id`'s interval reservations still need `node_id`'s memory: without
    it, the pool's other nodes in service could not cover what the pool promised."""
    if not await _promised(conn, pool_id, now):
        return False
    memory = await read(conn, pool_id, now)
    return pool_memory.needs_node(memory.commitments(node_id), memory.memory(node_id), now)


async def refresh_risk(
    conn: AsyncConnection, pool_ids: Iterable[str], changed: Mapping[str, str], now: int
) -> list[RiskChange]:
    """Re-judge the live interval reservations of `pool_ids`; returns those that became
    at risk or recovered. `changed`: poolId → a node whose change is being recorded
    there (what an alert is about when no node of the pool is out of service)."""
    changes: list[RiskChange] = []
    for pool_id in sorted(set(pool_ids)):
        if await _promised(conn, pool_id, now):
            memory = await read(conn, pool_id, now)
            changes += await _judge(conn, pool_id, memory, changed.get(pool_id, ""), now)
    return changes


async def _judge(
    conn: AsyncConnection, pool_id: str, memory: PoolMemory, changed: str, now: int
) -> list[RiskChange]:
    rids = sorted(memory.pool_wide)
    iv = schema.interval_reservations.c
    rows = (
        await conn.execute(
            select(iv.reservation_id, iv.tenant_id, iv.at_risk).where(iv.reservation_id.in_(rids))
        )
    ).all()
    commitments = memory.commitments()
    in_service = memory.memory()
    reason, nodes = pool_memory.blame(memory.out_of_service)
    atoms = [memory.node_atoms.get(node, node) for node in nodes]
    node_of = {atom: node for node, atom in memory.node_atoms.items()}
    # What an alert is about when it names no node out of service: the node whose change
    # this is, else one of the pool's (an alert's subject names a node).
    about = changed or min([*memory.in_service, *nodes], default=pool_id)
    changes: list[RiskChange] = []
    writes: list[dict[str, Any]] = []
    for row in rows:
        windows = [(max(c.start, now), c.end) for c in memory.pool_wide[row.reservation_id]]
        short = any(pool_memory.short_windows(commitments, in_service, windows))
        before = at_risk_from_json(row.at_risk)
        after = None
        if short:
            # Its `since` stays while it stays at risk, as for compute reservations.
            after = AtRisk(reason, before.since if before else now, tuple(sorted(atoms)))
        if after == before:
            continue
        writes.append({"b_id": row.reservation_id, "b_risk": at_risk_json(after)})
        if (before is None) != (after is None):
            named = (after or before).atoms  # type: ignore[union-attr]
            node_id = next((node_of[a] for a in named if a in node_of), about)
            changes.append(
                RiskChange(row.reservation_id, row.tenant_id, pool_id, node_id, after, before)
            )
    if writes:
        await conn.execute(
            update(schema.interval_reservations)
            .where(iv.reservation_id == bindparam("b_id"))
            .values(at_risk=bindparam("b_risk")),
            writes,
        )
    return changes
