"""Use in the ledger (SPEC §10): the live bookings that cover GPUs (read for the join),
the use pass's write (hour buckets added to in place, node events and alerts in one
transaction), and the buckets a usage report reads.

A unit is the UUID the agent reports use under: a whole GPU's or a time-sliced GPU's
(`device_id` of `gpu` and `gpu.slot` atoms), a MIG instance's (the `uuid` attribute of
a `gpu.mig` atom, else its atom id's last part). A whole-node booking covers every unit
of its node's current atoms.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from sqlalchemy import ColumnElement, func, or_, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.domain.consumption import MemoryAccrued, MemoryKey
from coordinator.domain.gpu_use_accrual import HOUR_MS, AccrualKey, Accrued
from coordinator.domain.gpu_use_book import AtomRow, atom_units
from coordinator.domain.gpu_use_conditions import OpenCondition
from coordinator.domain.gpu_use_report import UseHour
from coordinator.domain.gpu_use_units import COVERING_CLASSES, GPU_CLASSES, Hold, unit_of
from coordinator.domain.model import NewNodeEvent
from coordinator.ledger import schema
from coordinator.ledger.bulk import among
from coordinator.ledger.database import Database
from coordinator.ledger.memory_use import add_memory
from coordinator.ledger.outbox import with_pool_names
from coordinator.ledger.reservation_listing import state_condition
from shared.reservation_states import LIVE_STATES
from shared.wire import Alert


class GpuUseRepo:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def holds(
        self, node_ids: Iterable[str], now: int, since: int | None = None
    ) -> list[Hold]:
        """The bookings on these nodes that cover GPU units: those live at `now`, or with
        `since`, those live at any time in [since, now] (a use pass credits the time since
        the last one to the bookings of that time, ended ones included)."""
        since = now if since is None else since
        ids = list(node_ids)
        if not ids:
            return []
        b, a, rv = schema.bookings.c, schema.atoms.c, schema.reservations.c
        async with self._db.read() as conn:
            rows = (
                await conn.execute(
                    select(
                        b.reservation_id,
                        b.tenant_id,
                        b.pool_id,
                        b.node_id,
                        b.atom_id,
                        b["class"].label("cls"),
                        b.start,
                        b.end,
                        rv.project_id,
                        a.device_id,
                        a.attrs,
                    )
                    .select_from(
                        schema.bookings.outerjoin(schema.atoms, a.atom_id == b.atom_id).outerjoin(
                            schema.reservations, rv.reservation_id == b.reservation_id
                        )
                    )
                    .where(
                        among(conn, b.node_id, ids)
                        & (b.start <= now)
                        & (b.end > since)
                        & (b.end > b.start)
                        & b["class"].in_(sorted(COVERING_CLASSES))
                    )
                )
            ).all()
            whole = sorted({r.node_id for r in rows if r.cls == "node"})
            units: dict[str, list[str]] = {}
            if whole:
                for u in (
                    await conn.execute(
                        select(a.node_id, a.atom_id, a["class"].label("cls"), a.device_id, a.attrs)
                        .where(
                            among(conn, a.node_id, whole)
                            & a.retired.is_(False)
                            & a["class"].in_(sorted(GPU_CLASSES))
                        )
                        .order_by(a.atom_id)
                    )
                ).all():
                    unit = unit_of(u.cls, u.atom_id, u.device_id, u.attrs or {})
                    got = units.setdefault(u.node_id, [])
                    if unit not in got:
                        got.append(unit)
        out = []
        for r in rows:
            if r.cls == "node":
                covered = tuple(units.get(r.node_id, ()))
            elif r.device_id is None:
                continue  # the atom row is gone: nothing to match use against
            else:
                covered = (unit_of(r.cls, r.atom_id, r.device_id, r.attrs or {}),)
            out.append(
                Hold(
                    r.reservation_id, r.tenant_id, r.project_id, r.pool_id, r.node_id, r.cls,
                    covered, int(r.start), int(r.end),
                )
            )  # fmt: skip
        return out

    async def spread(self, reservation_ids: Iterable[str], now: int) -> dict[str, frozenset[str]]:
        """Reservation → the nodes it holds GPU-carrying atoms on at `now`."""
        ids = sorted(set(reservation_ids))
        if not ids:
            return {}
        b = schema.bookings.c
        out: dict[str, set[str]] = {}
        async with self._db.read() as conn:
            rows = await conn.execute(
                select(b.reservation_id, b.node_id)
                .where(
                    among(conn, b.reservation_id, ids) & (b.start <= now) & (b.end > now)
                    & b["class"].in_(sorted(COVERING_CLASSES))
                )
                .distinct()
            )  # fmt: skip
            for r in rows.all():
                out.setdefault(r.reservation_id, set()).add(r.node_id)
        return {k: frozenset(v) for k, v in out.items()}

    async def units(self) -> dict[str, frozenset[str]]:
        """Node → the units (GPU and MIG instance UUIDs) of its current atoms: the devices
        its use may name."""
        a = schema.atoms.c
        rows: dict[str, list[AtomRow]] = {}
        async with self._db.read() as conn:
            result = await conn.execute(
                select(a.node_id, a.atom_id, a["class"].label("cls"), a.device_id, a.attrs).where(
                    a.retired.is_(False) & a["class"].in_(sorted(GPU_CLASSES))
                )
            )
            for r in result.all():
                rows.setdefault(r.node_id, []).append(
                    (r.cls, r.atom_id, r.device_id, r.attrs or {})
                )
        return {node_id: atom_units(atoms) for node_id, atoms in rows.items()}

    async def tenants_of(self, reservation_ids: Iterable[str], now: int) -> dict[str, str]:
        """Reservation → tenant, of those of these that are live at `now` (scheduled,
        active or noticed): an id that names no live reservation is absent."""
        ids = sorted(set(reservation_ids))
        if not ids:
            return {}
        rv = schema.reservations.c
        live = or_(*(state_condition(state, now) for state in LIVE_STATES))
        async with self._db.read() as conn:
            rows = await conn.execute(
                select(rv.reservation_id, rv.tenant_id).where(
                    among(conn, rv.reservation_id, ids) & live
                )
            )
            return {r.reservation_id: r.tenant_id for r in rows.all()}

    async def record(
        self,
        accrued: Mapping[AccrualKey, Accrued],
        events: Sequence[NewNodeEvent],
        alerts: Sequence[Alert],
        opened: Sequence[OpenCondition] = (),
        closed: Sequence[str] = (),
        memory: Mapping[MemoryKey, MemoryAccrued] | None = None,
    ) -> None:
        """One pass's buckets, memory held, node events and alerts, and the use conditions
        they open and close, in one transaction (none when there is nothing to write: a
        fleet without use costs no write every pass)."""
        if not (accrued or events or alerts or opened or closed or memory):
            return
        async with self._db.transaction() as conn:
            await _add_buckets(conn, accrued)
            await add_memory(conn, memory or {})
            await _set_conditions(conn, opened, closed)
            if events:
                await conn.execute(
                    schema.node_events.insert(),
                    [
                        {
                            "node_id": e.node_id, "pool_id": e.pool_id, "kind": e.kind,
                            "reason": e.reason, "by": "coordinator", "at": e.at,
                            "device_id": e.device_id,
                        }
                        for e in events
                    ],
                )  # fmt: skip
            if alerts:
                alerts = await with_pool_names(conn, alerts)
                await conn.execute(
                    schema.alert_outbox.insert(),
                    [
                        {
                            "alert_id": a.alert_id, "payload": a.to_json().decode(),
                            "created_at": a.at, "attempts": 0,
                        }
                        for a in alerts
                    ],
                )  # fmt: skip

    async def conditions(self) -> list[OpenCondition]:
        """The use conditions said and not yet ended."""
        c = schema.use_conditions.c
        async with self._db.read() as conn:
            rows = (await conn.execute(select(schema.use_conditions).order_by(c.key))).all()
        return [
            OpenCondition(
                r.key, r.kind, r.pool_id, r.node_id, r.device_id, r.owner_kind, r.owner,
                r.reservation_id, r.tenant_id, r.since,
            )
            for r in rows
        ]  # fmt: skip

    async def said_idle(self) -> dict[str, int]:
        """Reservation → since when it is idle, for those said idle and not in use since
        (the open `reservation.idle` conditions): what a replica that does not lead shows."""
        c = schema.use_conditions.c
        async with self._db.read() as conn:
            rows = await conn.execute(
                select(c.reservation_id, c.since).where(c.kind == "reservation.idle")
            )
            return {r.reservation_id: int(r.since) for r in rows.all()}

    async def buckets(
        self,
        start: int,
        end: int,
        tenant_id: str | None = None,
        pool_id: str | None = None,
        project_id: str | None = None,
    ) -> list[UseHour]:
        """Every bucket whose hour overlaps [start, end)."""
        u = schema.gpu_use.c
        cond = _hours(start, end, tenant_id, pool_id, project_id)
        async with self._db.read() as conn:
            rows = await conn.execute(
                select(
                    u.hour, u.reservation_id, u.tenant_id, u.pool_id, u.project_id, u.resource,
                    u.used_ms, u.weighted_ms, u.unknown_ms, u.idle_ms,
                ).where(cond)
            )  # fmt: skip
            return [
                UseHour(
                    int(r.hour), r.reservation_id, r.tenant_id, r.pool_id, r.project_id,
                    r.resource, int(r.used_ms), int(r.weighted_ms), int(r.unknown_ms),
                    int(r.idle_ms),
                )
                for r in rows.all()
            ]  # fmt: skip

    async def summed(
        self,
        start: int,
        stop: int,
        tenant_id: str | None = None,
        pool_id: str | None = None,
        project_id: str | None = None,
    ) -> list[UseHour]:
        """The buckets of [start, stop) as a report needs them, few whatever the window:
        the whole hours inside it summed by the database per reservation and class (one
        bucket at the first of them), the at most two hours it cuts as they are."""
        u = schema.gpu_use.c
        first = -(-start // HOUR_MS) * HOUR_MS  # the first whole hour inside
        cond = _hours(start, stop, tenant_id, pool_id, project_id)
        inner = (u.hour >= first) & (u.hour + HOUR_MS <= stop)
        who = (u.reservation_id, u.tenant_id, u.pool_id, u.project_id, u.resource)
        async with self._db.read() as conn:
            whole = await conn.execute(
                select(
                    *who, func.sum(u.used_ms).label("used"), func.sum(u.weighted_ms).label("w"),
                    func.sum(u.unknown_ms).label("unknown"), func.sum(u.idle_ms).label("idle"),
                )
                .where(cond & inner)
                .group_by(*who)
            )  # fmt: skip
            out = [
                UseHour(first, r.reservation_id, r.tenant_id, r.pool_id, r.project_id, r.resource,
                       int(r.used), int(r.w), int(r.unknown), int(r.idle))
                for r in whole.all()
            ]  # fmt: skip
            cut = await conn.execute(
                select(u.hour, *who, u.used_ms, u.weighted_ms, u.unknown_ms, u.idle_ms).where(
                    cond & ~inner
                )
            )
            out += [
                UseHour(int(r.hour), r.reservation_id, r.tenant_id, r.pool_id, r.project_id,
                       r.resource, int(r.used_ms), int(r.weighted_ms), int(r.unknown_ms),
                       int(r.idle_ms))
                for r in cut.all()
            ]  # fmt: skip
        return out


def _hours(
    start: int, end: int, tenant_id: str | None, pool_id: str | None, project_id: str | None
) -> ColumnElement[bool]:
    """The buckets whose hour overlaps [start, end), of this tenant, pool and project
    where given."""
    u = schema.gpu_use.c
    cond: ColumnElement[bool] = (u.hour > start - HOUR_MS) & (u.hour < end)
    if tenant_id is not None:
        cond &= u.tenant_id == tenant_id
    if pool_id is not None:
        cond &= u.pool_id == pool_id
    if project_id is not None:
        cond &= u.project_id == project_id
    return cond


async def _add_buckets(conn: AsyncConnection, accrued: Mapping[AccrualKey, Accrued]) -> None:
    if not accrued:
        return
    rows = [
        {
            "hour": k.hour, "reservation_id": k.reservation_id, "node_id": k.node_id,
            "unit": k.unit, "resource": k.resource, "tenant_id": k.tenant_id,
            "pool_id": v.who.pool_id, "project_id": v.who.project_id,
            "used_ms": v.used_ms, "weighted_ms": v.weighted_ms, "unknown_ms": v.unknown_ms,
            "idle_ms": v.idle_ms,
        }
        for k, v in sorted(accrued.items(), key=lambda kv: _order(kv[0]))
    ]  # fmt: skip
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    stmt = dialect.insert(schema.gpu_use)
    stmt = stmt.on_conflict_do_update(
        index_elements=["hour", "reservation_id", "node_id", "unit", "resource", "tenant_id"],
        set_={
            "used_ms": schema.gpu_use.c.used_ms + stmt.excluded.used_ms,
            "weighted_ms": schema.gpu_use.c.weighted_ms + stmt.excluded.weighted_ms,
            "unknown_ms": schema.gpu_use.c.unknown_ms + stmt.excluded.unknown_ms,
            "idle_ms": schema.gpu_use.c.idle_ms + stmt.excluded.idle_ms,
        },
    )
    await conn.execute(stmt, rows)


async def _set_conditions(
    conn: AsyncConnection, opened: Sequence[OpenCondition], closed: Sequence[str]
) -> None:
    keys = sorted({c.key for c in opened} | set(closed))
    c = schema.use_conditions.c
    for i in range(0, len(keys), 500):
        await conn.execute(schema.use_conditions.delete().where(c.key.in_(keys[i : i + 500])))
    if opened:
        await conn.execute(
            schema.use_conditions.insert(),
            [
                {
                    "key": o.key, "kind": o.kind, "pool_id": o.pool_id, "node_id": o.node_id,
                    "device_id": o.device_id, "owner_kind": o.owner_kind, "owner": o.owner,
                    "reservation_id": o.reservation_id, "tenant_id": o.tenant_id,
                    "since": o.since,
                }
                for o in opened
            ],
        )  # fmt: skip


def _order(k: AccrualKey) -> tuple[int, str, str, str, str, str]:
    # One order for every writer: two passes never wait on each other's rows crosswise.
    return (k.hour, k.reservation_id, k.node_id, k.unit, k.resource, k.tenant_id)
