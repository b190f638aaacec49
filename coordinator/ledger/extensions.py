"""Moving a live booking's end inside a unit of work (`reservations.extend`).

Under the reservation's pool lock (after the tenant's quota lock, which the workflow
takes first), the row is read again and the new end judged (`domain.extension`): time
added must find the booking's own atoms and node resources free in the pool snapshot of
`[old end, new end)` and the tenant's quotas with room there; then the reservation,
its atom, scalar and claim rows move their end together. On PostgreSQL the claim rows'
exclusion constraints still guard the write (a race surfaces as `WriteRaced`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.domain.booking import OverQuota
from coordinator.domain.commitments import peak
from coordinator.domain.errors import CapacityNotAvailable
from coordinator.domain.extension import NodeAmount, blockers, check_end
from coordinator.domain.reservation import LIVE, Reservation
from coordinator.ledger import quotas, schema
from coordinator.ledger.database import lock_pool
from coordinator.ledger.reservations import owned
from coordinator.ledger.rollups import refresh_booked
from coordinator.ledger.snapshot import SnapshotCache, bump


@dataclass(frozen=True, slots=True)
class Extension:
    """A booking before and after its end moved."""

    before: Reservation
    after: Reservation


class ReservationExtender:
    def __init__(self, conn: AsyncConnection, snapshots: SnapshotCache) -> None:
        self._conn = conn
        self._snapshots = snapshots

    async def extend(
        self, reservation_id: str, tenant_id: str | None, end: int, now: int
    ) -> Extension:
        """The booking before and after its end moved to `end` (the same, unchanged,
        when it already ends then). Raises NOT_FOUND (not the tenant's), INVALID_INPUT
        (`check_end`), CAPACITY_NOT_AVAILABLE (its devices are not free for the added
        time) or QUOTA_EXCEEDED; nothing is written then."""
        conn = self._conn
        res = await owned(conn, reservation_id, tenant_id)
        await lock_pool(conn, res.pool_id)
        res = await owned(conn, reservation_id, tenant_id, for_update=True)
        if end == res.end and res.live(now):
            return Extension(res, res)
        check_end(res, end, now)
        if end > res.end:
            own = await self._own_scalars(reservation_id)
            await self._check_free(res, own, end, now)
            await self._check_quota(res, own, end)
        old = res.end
        rv = schema.reservations.c
        await conn.execute(
            update(schema.reservations)
            .where((rv.reservation_id == reservation_id) & (rv.state == LIVE))
            .values(end=end, updated_at=now)
        )
        for table in (schema.bookings, schema.scalar_bookings, schema.device_claims):
            c = table.c
            await conn.execute(
                update(table)
                .where((c.reservation_id == reservation_id) & (c.end == old))
                .values(end=end)
            )
        await bump(conn, [res.pool_id], bookings=True)
        await refresh_booked(conn, res.pool_id, now)
        return Extension(res, replace(res, end=end))

    async def _own_scalars(self, reservation_id: str) -> list[NodeAmount]:
        s = schema.scalar_bookings.c
        rows = await self._conn.execute(
            select(s.node_id, s.resource, s.amount).where(s.reservation_id == reservation_id)
        )
        return [NodeAmount(str(n), str(r), int(a)) for n, r, a in rows.all() if n]

    async def _check_free(
        self, res: Reservation, own: list[NodeAmount], end: int, now: int
    ) -> None:
        snap = await self._snapshots.snapshot(
            self._conn, res.pool_id, res.end, end, now, frozenset({res.reservation_id})
        )
        found = blockers(res, snap, own)
        if found:
            raise CapacityNotAvailable(
                "its devices are not free for the added time",
                {"reason": "its devices are not free for the added time",
                 "from": res.end, "to": end, "blocked": found},
            )  # fmt: skip

    async def _check_quota(self, res: Reservation, own: list[NodeAmount], end: int) -> None:
        """The added window within each quota the booking counts against, as a create
        of the same devices over it would be."""
        asked: dict[str, int] = {}
        for atom in res.atoms:
            asked[atom.cls] = asked.get(atom.cls, 0) + 1
        for sc in own:
            asked[sc.resource] = asked.get(sc.resource, 0) + sc.amount
        for quota in await quotas.applicable(self._conn, res.tenant_id, res.pool_id, asked):
            held = await quotas.commitments(
                self._conn, res.tenant_id, quota.resource, quota.pool_id, res.end, end
            )
            used = peak(held, res.end, end)
            if used + asked[quota.resource] > quota.limit:
                raise quotas.exceeded(OverQuota(quota, used, asked[quota.resource]))
