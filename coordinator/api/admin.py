"""Operator methods for bootstrapping a platform: tenants, API keys, pools and offers."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from coordinator.api.context import CallContext
from coordinator.api.fields import PoolId, TenantId
from coordinator.api.registry import REGISTRY, ApiInput
from coordinator.domain.model import Pool
from coordinator.errors import NotFound
from shared.ids import new_pool_id

Role = Literal["tenant", "operator"]


def _default_roles() -> list[Role]:
    return ["tenant"]


Name = Annotated[str, Field(min_length=1, max_length=256)]


class TenantCreateInput(ApiInput):
    tenant_id: TenantId
    name: Name | None = None


class ApiKeyCreateInput(ApiInput):
    tenant_id: TenantId
    roles: Annotated[list[Role], Field(min_length=1, max_length=2)] = Field(
        default_factory=_default_roles
    )
    label: Annotated[str, Field(max_length=256)] = ""


class ApiKeyRevokeInput(ApiInput):
    key_id: Annotated[str, Field(min_length=16, max_length=16)]


class PoolCreateInput(ApiInput):
    tenant_id: TenantId  # the owner
    name: Name
    gpu_model: Annotated[str, Field(min_length=1, max_length=256)] | None = None


class PoolOfferInput(ApiInput):
    pool_id: PoolId
    tenant_id: TenantId  # the tenant the pool is offered to


def pool_out(pool: Pool) -> dict[str, Any]:
    return {
        "poolId": pool.pool_id,
        "name": pool.name,
        "gpuModel": pool.gpu_model,
        "owner": pool.owner,
        "archived": pool.archived,
        "offeredTo": sorted(pool.offered_to),
        "createdAt": pool.created_at,
    }


@REGISTRY.method(
    "tenants.create",
    kind="write",
    permission="platform:admin",
    scope="platform",
    input=TenantCreateInput,
)
async def tenants_create(ctx: CallContext, body: TenantCreateInput) -> dict[str, Any]:
    """Create a tenant (operator)."""
    t = await ctx.ledger.tenants.create(body.tenant_id, body.name or body.tenant_id, ctx.now())
    return {"tenantId": t.tenant_id, "name": t.name, "createdAt": t.created_at}


@REGISTRY.method(
    "apiKeys.create",
    kind="write",
    permission="platform:admin",
    scope="platform",
    input=ApiKeyCreateInput,
)
async def api_keys_create(ctx: CallContext, body: ApiKeyCreateInput) -> dict[str, Any]:
    """Create an API key for a tenant (operator). The key is shown once, stored hashed."""
    if await ctx.ledger.tenants.get(body.tenant_id) is None:
        raise NotFound(f"tenant {body.tenant_id!r} not found")
    key_id, key = await ctx.ledger.keys.create(
        body.tenant_id, frozenset(body.roles), body.label, ctx.now()
    )
    return {"keyId": key_id, "key": key, "tenantId": body.tenant_id, "roles": sorted(body.roles)}


@REGISTRY.method(
    "apiKeys.revoke",
    kind="write",
    permission="platform:admin",
    scope="platform",
    input=ApiKeyRevokeInput,
)
async def api_keys_revoke(ctx: CallContext, body: ApiKeyRevokeInput) -> dict[str, Any]:
    """Revoke an API key (operator); it stops working at once."""
    if not await ctx.ledger.keys.revoke(body.key_id, None, ctx.now()):
        raise NotFound(f"key {body.key_id} not found or already revoked")
    return {"keyId": body.key_id, "revoked": True}


@REGISTRY.method(
    "pools.create",
    kind="write",
    permission="platform:admin",
    scope="platform",
    input=PoolCreateInput,
)
async def pools_create(ctx: CallContext, body: PoolCreateInput) -> dict[str, Any]:
    """Create a pool owned by a tenant (operator)."""
    if await ctx.ledger.tenants.get(body.tenant_id) is None:
        raise NotFound(f"tenant {body.tenant_id!r} not found")
    pool = await ctx.ledger.pools.create(
        new_pool_id(), body.name, body.tenant_id, body.gpu_model, ctx.now()
    )
    return pool_out(pool)


@REGISTRY.method(
    "pools.offer",
    kind="write",
    permission="platform:admin",
    scope="platform",
    input=PoolOfferInput,
)
async def pools_offer(ctx: CallContext, body: PoolOfferInput) -> dict[str, Any]:
    """Offer a pool to another tenant (operator)."""
    if await ctx.ledger.pools.get(body.pool_id) is None:
        raise NotFound(f"pool {body.pool_id} not found")
    if await ctx.ledger.tenants.get(body.tenant_id) is None:
        raise NotFound(f"tenant {body.tenant_id!r} not found")
    await ctx.ledger.pools.offer(body.pool_id, body.tenant_id, ctx.now())
    pool = await ctx.ledger.pools.get(body.pool_id)
    assert pool is not None
    return pool_out(pool)
