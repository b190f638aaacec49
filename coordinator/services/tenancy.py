"""Tenancy as workflows: an operator's (create a tenant, issue or revoke an API key, set
a quota) and a tenant's own (create a project). Each is one write; what it names (the
tenant, the pool) must exist first, or the call is NOT_FOUND and nothing is written."""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.domain.errors import NotFound
from coordinator.domain.model import IssuedKey, Project, Quota, Tenant
from coordinator.ledger import Ledger
from shared.clock import Clock
from shared.ids import ulid


@dataclass(frozen=True, slots=True)
class Tenancy:
    ledger: Ledger
    clock: Clock

    async def create_tenant(self, tenant_id: str, name: str) -> Tenant:
        return await self.ledger.tenants.create(tenant_id, name, self.clock.now_ms())

    async def issue_key(self, tenant_id: str, roles: frozenset[str], label: str) -> IssuedKey:
        """A new key for the tenant; its secret is in the answer only, stored hashed."""
        await self._require_tenant(tenant_id)
        return await self.ledger.keys.create(tenant_id, roles, label, self.clock.now_ms())

    async def revoke_key(self, key_id: str) -> None:
        """Revoke the key at once (NOT_FOUND if unknown or already revoked)."""
        if not await self.ledger.keys.revoke(key_id, None, self.clock.now_ms()):
            raise NotFound(f"key {key_id} not found or already revoked")

    async def set_quota(self, quota: Quota) -> list[Quota]:
        """Set one limit; returns every limit of the tenant as it now stands."""
        await self._require_tenant(quota.tenant_id)
        if quota.pool_id is not None and await self.ledger.pools.get(quota.pool_id) is None:
            raise NotFound(f"pool {quota.pool_id} not found")
        await self.ledger.quotas.set(quota, self.clock.now_ms())
        return await self.ledger.quotas.for_tenant(quota.tenant_id)

    async def create_project(self, tenant_id: str, name: str) -> Project:
        """A new project of the tenant, `prj_` + ULID (ALREADY_EXISTS for a name it has)."""
        await self._require_tenant(tenant_id)
        now = self.clock.now_ms()
        project = Project("prj_" + ulid(now), tenant_id, name, now)
        return await self.ledger.projects.create(project)

    async def _require_tenant(self, tenant_id: str) -> None:
        if await self.ledger.tenants.get(tenant_id) is None:
            raise NotFound(f"tenant {tenant_id!r} not found")
