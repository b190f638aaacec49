"""Quotas per tenant, pool (or every pool) and resource, set by operators."""

from __future__ import annotations

from sqlalchemy import delete, select

from coordinator.domain.model import Quota
from coordinator.ledger import schema
from coordinator.ledger.database import Database


class QuotaRepo:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def set(self, quota: Quota, now: int) -> None:
        q = schema.quotas.c
        key = (
            (q.tenant_id == quota.tenant_id)
            & (q.pool_id == (quota.pool_id or ""))
            & (q.resource == quota.resource)
        )
        async with self._db.transaction() as conn:
            await conn.execute(delete(schema.quotas).where(key))
            await conn.execute(
                schema.quotas.insert().values(
                    tenant_id=quota.tenant_id,
                    pool_id=quota.pool_id or "",
                    resource=quota.resource,
                    limit=quota.limit,
                    updated_at=now,
                )
            )

    async def for_tenant(self, tenant_id: str) -> list[Quota]:
        q = schema.quotas.c
        async with self._db.read() as conn:
            rows = await conn.execute(
                select(schema.quotas)
                .where(q.tenant_id == tenant_id)
                .order_by(q.pool_id, q.resource)
            )
            return [Quota(r.tenant_id, r.pool_id or None, r.resource, r.limit) for r in rows.all()]
