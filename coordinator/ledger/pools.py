"""Pools, their offers to other tenants, and archiving."""

from __future__ import annotations

from collections import defaultdict

from sqlalchemy import Row, delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.domain.errors import NotFound
from coordinator.domain.model import Pool
from coordinator.domain.rollup import compute_rollup
from coordinator.ledger import schema
from coordinator.ledger.database import Database
from coordinator.ledger.rollups import write_rollup


def _pool(row: Row[tuple[object, ...]] | Row, offers: frozenset[str]) -> Pool:  # type: ignore[type-arg]
    return Pool(
        pool_id=row.pool_id,
        name=row.name,
        owner=row.owner,
        gpu_model=row.gpu_model,
        archived=bool(row.archived),
        created_at=row.created_at,
        offered_to=offers,
    )


class PoolRepo:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def create(
        self, pool_id: str, name: str, owner: str, gpu_model: str | None, now: int
    ) -> Pool:
        try:
            async with self._db.transaction() as conn:
                await conn.execute(
                    schema.pools.insert().values(
                        pool_id=pool_id,
                        name=name,
                        owner=owner,
                        gpu_model=gpu_model,
                        archived=False,
                        created_at=now,
                    )
                )
                await conn.execute(
                    schema.pool_versions.insert().values(
                        pool_id=pool_id, nodes_version=0, bookings_version=0
                    )
                )
                # Every pool has all its rollup rows from the start (zeros).
                await write_rollup(conn, pool_id, compute_rollup((), None, now))
        except IntegrityError as exc:
            raise NotFound(f"tenant {owner!r} not found") from exc
        return Pool(pool_id, name, owner, gpu_model, False, now)

    async def get(self, pool_id: str) -> Pool | None:
        async with self._db.read() as conn:
            pools = await self._load(conn, schema.pools.c.pool_id == pool_id)
        return pools[0] if pools else None

    async def list_all(self) -> list[Pool]:
        async with self._db.read() as conn:
            return await self._load(conn, None)

    async def list_visible(self, tenant_id: str) -> list[Pool]:
        """Owned pools (archived included) and pools offered to the tenant (not archived)."""
        p, o = schema.pools.c, schema.pool_offers.c
        offered = select(o.pool_id).where(o.tenant_id == tenant_id)
        cond = (p.owner == tenant_id) | ((p.pool_id.in_(offered)) & (p.archived.is_(False)))
        async with self._db.read() as conn:
            return await self._load(conn, cond)

    async def _load(self, conn: AsyncConnection, cond: object) -> list[Pool]:
        query = select(schema.pools).order_by(schema.pools.c.pool_id)
        if cond is not None:
            query = query.where(cond)  # type: ignore[arg-type]
        rows = (await conn.execute(query)).all()
        if not rows:
            return []
        ids = [r.pool_id for r in rows]
        offers: dict[str, set[str]] = defaultdict(set)
        o = schema.pool_offers.c
        for pool_id, tenant_id in (
            await conn.execute(select(o.pool_id, o.tenant_id).where(o.pool_id.in_(ids)))
        ).all():
            offers[pool_id].add(tenant_id)
        return [_pool(r, frozenset(offers[r.pool_id])) for r in rows]

    async def offer(self, pool_id: str, tenant_id: str, now: int) -> None:
        o = schema.pool_offers.c
        async with self._db.transaction() as conn:
            exists = (
                await conn.execute(
                    select(o.pool_id).where((o.pool_id == pool_id) & (o.tenant_id == tenant_id))
                )
            ).first()
            if exists is None:
                await conn.execute(
                    schema.pool_offers.insert().values(
                        pool_id=pool_id, tenant_id=tenant_id, created_at=now
                    )
                )

    async def unoffer(self, pool_id: str, tenant_id: str) -> None:
        o = schema.pool_offers.c
        async with self._db.transaction() as conn:
            await conn.execute(
                delete(schema.pool_offers).where(
                    (o.pool_id == pool_id) & (o.tenant_id == tenant_id)
                )
            )

    async def archive(self, pool_id: str) -> None:
        async with self._db.transaction() as conn:
            await conn.execute(
                update(schema.pools).where(schema.pools.c.pool_id == pool_id).values(archived=True)
            )
