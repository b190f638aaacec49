"""Pools as workflows: an operator creates one for a tenant; its owner offers it to
another tenant, withdraws an offer or archives it. Each is one write and answers the
pool as it stands after it. Who may act (the owner) is the API's check; that the
tenants named exist is checked here, before anything is written."""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.domain.errors import NotFound
from coordinator.domain.model import Pool
from coordinator.ledger import Ledger
from shared.clock import Clock
from shared.ids import new_pool_id


@dataclass(frozen=True, slots=True)
class Pools:
    ledger: Ledger
    clock: Clock

    async def create(self, owner: str, name: str, gpu_model: str | None) -> Pool:
        await self._require_tenant(owner)
        return await self.ledger.pools.create(
            new_pool_id(), name, owner, gpu_model, self.clock.now_ms()
        )

    async def offer(self, pool_id: str, tenant_id: str) -> Pool:
        await self._require_tenant(tenant_id)
        await self.ledger.pools.offer(pool_id, tenant_id, self.clock.now_ms())
        return await self._reread(pool_id)

    async def unoffer(self, pool_id: str, tenant_id: str) -> Pool:
        await self.ledger.pools.unoffer(pool_id, tenant_id)
        return await self._reread(pool_id)

    async def archive(self, pool_id: str) -> Pool:
        await self.ledger.pools.archive(pool_id)
        return await self._reread(pool_id)

    async def _reread(self, pool_id: str) -> Pool:
        """The pool as it is after the change."""
        pool = await self.ledger.pools.get(pool_id)
        assert pool is not None
        return pool

    async def _require_tenant(self, tenant_id: str) -> None:
        if await self.ledger.tenants.get(tenant_id) is None:
            raise NotFound(f"tenant {tenant_id!r} not found")
