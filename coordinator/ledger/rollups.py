"""Stored rollup rows: read them, write them, and rebuild them from the ledger.

Every change that moves atoms between buckets updates the touched pool's rows in the
same transaction (the bucket columns by delta, the booked columns recounted, since
bookings on atoms that left the allocatable bucket stop counting); the periodic rebuild
compares what it computes with what is stored — booked columns included, as of the
instant each row was written — and counts the rows it had to correct (drift).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Update,
    bindparam,
    case,
    delete,
    distinct,
    func,
    literal,
    select,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.domain.commitments import Commitment, peak
from coordinator.domain.model import (
    RESOURCES,
    SCALAR_RESOURCES,
    AtomView,
    BookedUnits,
    NodeState,
    NodeView,
    RollupRow,
)
from coordinator.domain.rollup import STATE_COLUMNS, Delta, compute_rollup, rollup_delta
from coordinator.domain.states import atom_bucket, node_bucket
from coordinator.ledger import schema
from coordinator.ledger.bulk import among
from coordinator.ledger.database import lock_pool
from coordinator.ledger.snapshot import bump
from shared.counts import COUNT_COLUMNS

_COLUMNS = COUNT_COLUMNS


async def write_rollup(conn: AsyncConnection, pool_id: str, rows: Mapping[str, RollupRow]) -> None:
    await conn.execute(delete(schema.rollup).where(schema.rollup.c.pool_id == pool_id))
    await conn.execute(
        schema.rollup.insert(),
        [
            {"pool_id": pool_id, "resource": r.resource, "updated_at": r.updated_at}
            | {c: getattr(r, c) for c in _COLUMNS}
            for r in rows.values()
        ],
    )


async def read_rollup(conn: AsyncConnection, pool_ids: Iterable[str]) -> dict[str, list[RollupRow]]:
    """Rows per pool, each list ordered by resource name."""
    ids = list(pool_ids)
    out: dict[str, list[RollupRow]] = {p: [] for p in ids}
    if not ids:
        return out
    r = schema.rollup.c
    result = await conn.execute(
        select(schema.rollup).where(r.pool_id.in_(ids)).order_by(r.pool_id, r.resource)
    )
    for row in result.all():
        out[row.pool_id].append(
            RollupRow(
                resource=row.resource,
                updated_at=row.updated_at,
                **{c: int(getattr(row, c)) for c in _COLUMNS},
            )
        )
    return out


async def load_node_views(
    conn: AsyncConnection, pool_id: str | None = None, node_ids: Iterable[str] | None = None
) -> list[NodeView]:
    """Nodes with their live atoms, of one pool or of the given node ids. A node that
    shows a device another node holds is counted by its flags: the node change that
    finds it holds it in provisioning (`identities.shown_elsewhere`), so no read here
    judges it again."""
    n, a = schema.nodes.c, schema.atoms.c
    node_cond: ColumnElement[bool]
    atom_cond: ColumnElement[bool]
    if node_ids is not None:
        ids = list(node_ids)
        node_cond, atom_cond = among(conn, n.node_id, ids), among(conn, a.node_id, ids)
    else:
        node_cond, atom_cond = n.pool_id == pool_id, a.pool_id == pool_id
    # Only the columns a view needs: the stored inventory document is large.
    columns = (
        n.node_id, n.pool_id, n.reachable, n.health, n.maintenance, n.provisioning, n.vcpu,
        n.memory_gib, n.hugepages_1gi,
    )  # fmt: skip
    node_rows = (await conn.execute(select(*columns).where(node_cond))).all()
    atoms_by_node: dict[str, list[AtomView]] = defaultdict(list)
    atom_rows = await conn.execute(
        select(a.atom_id, a.node_id, a["class"], a.device_id, a.health).where(
            atom_cond & (a.retired.is_(False))
        )
    )
    for row in atom_rows.all():
        atoms_by_node[row.node_id].append(
            AtomView(row.atom_id, row.node_id, row[2], row.device_id, row.health)
        )
    return [
        NodeView(
            node_id=row.node_id,
            pool_id=row.pool_id,
            state=NodeState(
                reachable=bool(row.reachable),
                health=row.health,
                maintenance=bool(row.maintenance),
                provisioning=bool(row.provisioning),
            ),
            atoms=tuple(atoms_by_node[row.node_id]),
            vcpu=row.vcpu,
            memory_gib=row.memory_gib,
            hugepages_1gi=row.hugepages_1gi,
        )
        for row in node_rows
    ]


async def allocatable_scope(conn: AsyncConnection, pool_id: str) -> tuple[list[str], list[str]]:
    """The pool's allocatable nodes, and the atoms on them that are not allocatable (a
    device fault, a retired form): bookings outside that scope are not counted in the
    booked columns — their reservations are at risk instead (SPEC §2)."""
    n, a = schema.nodes.c, schema.atoms.c
    node_rows = await conn.execute(
        select(n.node_id, n.reachable, n.health, n.maintenance, n.provisioning).where(
            n.pool_id == pool_id
        )
    )
    states = {
        row.node_id: NodeState(
            reachable=bool(row.reachable),
            health=row.health,
            maintenance=bool(row.maintenance),
            provisioning=bool(row.provisioning),
        )
        for row in node_rows.all()
    }
    nodes = sorted(node_id for node_id, st in states.items() if node_bucket(st) == "allocatable")
    if not nodes:
        return [], []
    atom_rows = await conn.execute(
        select(a.atom_id, a.node_id, a["class"], a.device_id, a.health, a.retired).where(
            (a.pool_id == pool_id)
            & a.node_id.in_(nodes)
            & (a.retired.is_(True) | (a.health != "healthy"))
        )
    )
    excluded = []
    for row in atom_rows.all():
        atom = AtomView(row.atom_id, row.node_id, row[2], row.device_id, row.health)
        if row.retired or atom_bucket(states[row.node_id], atom) != "allocatable":
            excluded.append(row.atom_id)
    return nodes, excluded


async def booked_units(
    conn: AsyncConnection, pool_id: str, now: int, resources: Iterable[str] | None = None
) -> BookedUnits:
    """What counts in `allocated` and `reserved` at `now` (of `resources`, or all):
    allocatable atoms booked now and booked to start later, once per atom in each; for
    scalars, the amount committed now and the peak of what is committed later (two
    future bookings that never overlap do not add up). Only bookings on allocatable
    atoms and nodes count; pool-level bookings (interval reservations) always do."""
    wanted = set(RESOURCES if resources is None else resources)
    nodes, excluded = await allocatable_scope(conn, pool_id)
    b, s = schema.bookings.c, schema.scalar_bookings.c
    allocated: dict[str, int] = {}
    reserved: dict[str, int] = {}
    classes = sorted(wanted - set(SCALAR_RESOURCES))
    if classes and nodes:
        in_scope = (b.pool_id == pool_id) & b.node_id.in_(nodes) & b["class"].in_(classes)
        if excluded:
            in_scope &= b.atom_id.not_in(excluded)
        for target, cond in (
            (allocated, (b.start <= now) & (b.end > now)),
            (reserved, b.start > now),
        ):
            rows = await conn.execute(
                select(b["class"], func.count(distinct(b.atom_id)))
                .where(in_scope & cond)
                .group_by(b["class"])
            )
            target.update({cls: int(n) for cls, n in rows.all()})
    scalars = sorted(wanted & set(SCALAR_RESOURCES))
    if scalars:
        rows = await conn.execute(
            select(s.resource, s.start, s.end, s.amount).where(
                (s.pool_id == pool_id)
                & s.resource.in_(scalars)
                & (s.end > now)
                & ((s.node_id == "") | s.node_id.in_(nodes))
            )
        )
        later: dict[str, list[Commitment]] = defaultdict(list)
        for resource, start, end, amount in rows.all():
            if start <= now:
                allocated[resource] = allocated.get(resource, 0) + int(amount)
            else:
                later[resource].append(Commitment(int(start), int(end), int(amount)))
        for resource, held in later.items():
            reserved[resource] = peak(held, now, max(c.end for c in held))
    return BookedUnits(allocated, reserved)


async def refresh_booked(
    conn: AsyncConnection, pool_id: str, now: int, resources: Iterable[str] | None = None
) -> None:
    """Write a pool's allocated/reserved/available (of `resources`, or all) from the
    ledger after bookings changed (same transaction as the booking)."""
    wanted = sorted(set(RESOURCES if resources is None else resources))
    booked = await booked_units(conn, pool_id, now, wanted)
    r = schema.rollup.c
    for resource in wanted:
        allocated = booked.allocated.get(resource, 0)
        reserved = booked.reserved.get(resource, 0)
        free = r.allocatable - literal(allocated) - literal(reserved)
        await conn.execute(
            update(schema.rollup)
            .where((r.pool_id == pool_id) & (r.resource == resource))
            .values(
                allocated=allocated,
                reserved=reserved,
                available=case((free > 0, free), else_=0),
                updated_at=now,
            )
        )


def _booked_delta_update() -> Update:
    r = schema.rollup.c
    da, dr = bindparam("d_allocated", type_=BigInteger), bindparam("d_reserved", type_=BigInteger)
    free = r.allocatable - r.allocated - r.reserved - da - dr
    return (
        update(schema.rollup)
        .where((r.pool_id == bindparam("w_pool")) & (r.resource == bindparam("w_resource")))
        .values(
            allocated=r.allocated + da,
            reserved=r.reserved + dr,
            available=case((free > 0, free), else_=0),
            updated_at=bindparam("w_now", type_=BigInteger),
        )
    )


# Built once: every booking (every batch of them) runs it, and building the statement
# and its cache key again cost more than the booking's own rows (~9,000 bytecodes a
# batch).
_BOOKED_DELTA = _booked_delta_update()


async def apply_booked_delta(
    conn: AsyncConnection,
    pool_id: str,
    allocated: dict[str, int],
    reserved: dict[str, int],
    now: int,
) -> None:
    """Add newly booked units to `allocated`/`reserved` in SQL (the booking's own
    transaction); the periodic rebuild and the boundary refresh correct any drift."""
    for resource in sorted(set(allocated) | set(reserved)):
        await conn.execute(
            _BOOKED_DELTA,
            {
                "w_pool": pool_id,
                "w_resource": resource,
                "d_allocated": allocated.get(resource, 0),
                "d_reserved": reserved.get(resource, 0),
                "w_now": now,
            },
        )


async def rebuild_pool(conn: AsyncConnection, pool_id: str, now: int) -> int:
    """Recompute one pool's rows from nodes, atoms and bookings; returns how many rows
    had drifted from what was stored."""
    views = await load_node_views(conn, pool_id)
    fresh = compute_rollup(views, await booked_units(conn, pool_id, now), now)
    stored = {r.resource: r for r in (await read_rollup(conn, [pool_id]))[pool_id]}
    # Booked columns also move with the clock alone (a booking starts), so they are
    # checked as of the instant the row was written, not as of now.
    as_written: dict[int, BookedUnits] = {}
    for row in stored.values():
        if row.updated_at not in as_written:
            as_written[row.updated_at] = await booked_units(conn, pool_id, row.updated_at)
    drift = sum(
        1
        for res, row in fresh.items()
        if res not in stored
        or any(getattr(stored[res], c) != getattr(row, c) for c in STATE_COLUMNS)
        or _booked_drifted(stored[res], as_written[stored[res].updated_at])
    )
    await write_rollup(conn, pool_id, fresh)
    return drift


def _booked_drifted(row: RollupRow, booked: BookedUnits) -> bool:
    allocated = booked.allocated.get(row.resource, 0)
    reserved = booked.reserved.get(row.resource, 0)
    available = max(0, row.allocatable - allocated - reserved)
    return (row.allocated, row.reserved, row.available) != (allocated, reserved, available)


async def apply_rollup_delta(conn: AsyncConnection, pool_id: str, delta: Delta, now: int) -> None:
    """Add a delta to stored rows in SQL; `available` is recomputed from the new values."""
    r = schema.rollup.c
    for resource, cols in delta.items():
        values: dict[str, object] = {
            c: getattr(r, c) + literal(cols.get(c, 0)) for c in STATE_COLUMNS if cols.get(c)
        }
        free = r.allocatable + literal(cols.get("allocatable", 0)) - r.allocated - r.reserved
        values["available"] = case((free > 0, free), else_=0)
        values["updated_at"] = now
        await conn.execute(
            update(schema.rollup)
            .where((r.pool_id == pool_id) & (r.resource == resource))
            .values(**values)
        )


class NodeChange:
    """Brackets a change to some nodes: `begin` snapshots them, `settle` applies the
    rollup deltas of what changed, both in the caller's transaction (incremental, not a
    pool rebuild)."""

    def __init__(self, conn: AsyncConnection, ids: list[str], before: list[NodeView]) -> None:
        self._conn = conn
        self._ids = ids
        self._before = {v.node_id: v for v in before}

    @classmethod
    async def begin(cls, conn: AsyncConnection, node_ids: Iterable[str]) -> NodeChange:
        ids = list(node_ids)
        return cls(conn, ids, await load_node_views(conn, node_ids=ids))

    async def settle(self, now: int, fresh: Iterable[NodeView] = ()) -> None:
        """`fresh`: nodes written in this transaction whose views the caller already
        has (a registering batch), so only the others are read back."""
        after = {v.node_id: v for v in fresh}
        rest = [i for i in self._ids if i not in after]
        if rest:
            after |= {v.node_id: v for v in await load_node_views(self._conn, node_ids=rest)}
        touched = {v.pool_id for v in after.values()} | {v.pool_id for v in self._before.values()}
        # A rebuild writes absolute rows under the pool lock; deltas wait for it.
        for pool_id in sorted(touched):
            await lock_pool(self._conn, pool_id)
        await bump(self._conn, touched, nodes=True)
        recount: set[str] = set()
        # Summed per pool first: a batch of many nodes is one update per pool and resource.
        deltas: dict[str, Delta] = {}
        for node_id in self._ids:
            old, new = self._before.get(node_id), after.get(node_id)
            if old is not None and new is not None and old.pool_id != new.pool_id:
                _add(deltas.setdefault(old.pool_id, {}), rollup_delta(old, None))
                _add(deltas.setdefault(new.pool_id, {}), rollup_delta(None, new))
                recount |= {old.pool_id, new.pool_id}
            elif old is not None or new is not None:
                pool_id = (new or old).pool_id  # type: ignore[union-attr]
                _add(deltas.setdefault(pool_id, {}), rollup_delta(old, new))
                if old is not None and _allocatable(old) != _allocatable(new):
                    recount.add(pool_id)
        for pool_id in sorted(deltas):
            delta = {r: {c: n for c, n in cols.items() if n} for r, cols in deltas[pool_id].items()}
            delta = {r: cols for r, cols in delta.items() if cols}
            if delta:
                await apply_rollup_delta(self._conn, pool_id, delta, now)
        # Atoms that left (or rejoined) the allocatable bucket take their bookings out of
        # (or back into) the booked columns. A new node holds no bookings yet.
        for pool_id in sorted(recount):
            await refresh_booked(self._conn, pool_id, now)


def _add(into: Delta, delta: Delta) -> None:
    for resource, cols in delta.items():
        target = into.setdefault(resource, {})
        for col, n in cols.items():
            target[col] = target.get(col, 0) + n


def _allocatable(node: NodeView | None) -> frozenset[str]:
    """The node's atoms in the allocatable bucket, and the node itself when its vCPU,
    memory and hugepages are."""
    if node is None or node_bucket(node.state) != "allocatable":
        return frozenset()
    atoms = (a.atom_id for a in node.atoms if atom_bucket(node.state, a) == "allocatable")
    return frozenset((node.node_id, *atoms))
