"""pools.create/get/list/offer/unoffer/archive and pools.capacity.

Operators create pools for a tenant; the owner (or an operator acting for it) offers,
unoffers and archives them. Anyone the pool is visible to may read it. Offers show only
to the owner: a tenant is never told who else a pool is offered to.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from coordinator.api.http.context import CallContext
from coordinator.api.http.registry import REGISTRY
from coordinator.api.methods.capacity import ByPoolInput, by_pool
from coordinator.api.shapes import outputs as out
from coordinator.api.shapes.base import ApiInput
from coordinator.api.shapes.fields import PoolId, TenantId
from coordinator.domain.errors import PermissionDenied
from coordinator.domain.model import Pool

Name = Annotated[str, Field(min_length=1, max_length=256)]


class PoolCreateInput(ApiInput):
    tenant_id: TenantId = Field(description="The tenant that will own it.")
    name: Name = Field(description="Its name.", examples=["training"])
    gpu_model: Annotated[str, Field(min_length=1, max_length=256)] | None = Field(
        default=None, description="Its GPU model (capacity.summary sums per model)."
    )


class PoolRef(ApiInput):
    tenant_id: TenantId = Field(description="The tenant asking (owner or offered).")
    pool_id: PoolId = Field(description="The pool.")


class PoolListInput(ApiInput):
    tenant_id: TenantId = Field(description="The tenant whose visible pools to list.")


class PoolOfferInput(ApiInput):
    tenant_id: TenantId = Field(description="The pool's owner, acting.")
    pool_id: PoolId = Field(description="The pool.")
    offer_to: TenantId = Field(
        description="The tenant offered to (or withdrawn from).", examples=["globex"]
    )


def pool_out(pool: Pool, viewer: str) -> out.PoolOut:
    return out.PoolOut(
        pool_id=pool.pool_id,
        name=pool.name,
        gpu_model=pool.gpu_model,
        owner=pool.owner,
        archived=pool.archived,
        created_at=pool.created_at,
        offered_to=sorted(pool.offered_to) if viewer == pool.owner else None,
    )


def _require_owner(ctx: CallContext, tenant_id: str, action: str) -> Pool:
    pool = ctx.require_pool()
    if pool.owner != tenant_id:
        raise PermissionDenied(f"only the pool's owner may {action} it")
    return pool


@REGISTRY.method(
    "pools.create", kind="write", permission="platform:admin", scope="platform",
    input=PoolCreateInput, output=out.PoolOut,
)  # fmt: skip
async def pools_create(ctx: CallContext, body: PoolCreateInput) -> out.PoolOut:
    """Create a pool owned by a tenant (operator)."""
    pool = await ctx.services.pools.create(body.tenant_id, body.name, body.gpu_model)
    return pool_out(pool, body.tenant_id)


@REGISTRY.method(
    "pools.get", kind="read", permission="compute:pools:read", scope="compute-pool",
    input=PoolRef, output=out.PoolOut, phase="v0.2",
)  # fmt: skip
async def pools_get(ctx: CallContext, body: PoolRef) -> out.PoolOut:
    """One pool the tenant owns or is offered."""
    return pool_out(ctx.require_pool(), body.tenant_id)


@REGISTRY.method(
    "pools.list", kind="read", permission="compute:pools:read", scope="compute-tenant",
    input=PoolListInput, output=out.PoolList, phase="v0.2",
)  # fmt: skip
async def pools_list(ctx: CallContext, body: PoolListInput) -> out.PoolList:
    """Every pool the tenant owns (archived included) or is offered (not archived)."""
    pools = await ctx.ledger.pools.list_visible(body.tenant_id)
    return out.PoolList(
        tenant_id=body.tenant_id, pools=[pool_out(p, body.tenant_id) for p in pools]
    )


@REGISTRY.method(
    "pools.offer", kind="write", permission="compute:pools:write", scope="compute-pool",
    input=PoolOfferInput, output=out.PoolOut, phase="v0.2",
)  # fmt: skip
async def pools_offer(ctx: CallContext, body: PoolOfferInput) -> out.PoolOut:
    """Offer a pool to another tenant (owner)."""
    pool = _require_owner(ctx, body.tenant_id, "offer")
    updated = await ctx.services.pools.offer(pool.pool_id, body.offer_to)
    return pool_out(updated, body.tenant_id)


@REGISTRY.method(
    "pools.unoffer", kind="write", permission="compute:pools:write", scope="compute-pool",
    input=PoolOfferInput, output=out.PoolOut, phase="v0.2",
)  # fmt: skip
async def pools_unoffer(ctx: CallContext, body: PoolOfferInput) -> out.PoolOut:
    """Withdraw an offer (owner); the pool vanishes for that tenant at once."""
    pool = _require_owner(ctx, body.tenant_id, "unoffer")
    updated = await ctx.services.pools.unoffer(pool.pool_id, body.offer_to)
    return pool_out(updated, body.tenant_id)


@REGISTRY.method(
    "pools.archive", kind="write", permission="compute:pools:write", scope="compute-pool",
    input=PoolRef, output=out.PoolOut, phase="v0.2",
)  # fmt: skip
async def pools_archive(ctx: CallContext, body: PoolRef) -> out.PoolOut:
    """Archive a pool (owner): it stays visible to its owner only."""
    pool = _require_owner(ctx, body.tenant_id, "archive")
    updated = await ctx.services.pools.archive(pool.pool_id)
    return pool_out(updated, body.tenant_id)


# The same rows as capacity.byPool, under the pools module.
REGISTRY.method(
    "pools.capacity", kind="read", permission="compute:capacity:read", scope="compute-pool",
    input=ByPoolInput, output=out.PoolRows, phase="v0.2",
)(by_pool)  # fmt: skip
