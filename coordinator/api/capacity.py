"""capacity.summary and capacity.byPool, exactly as seed 000 describes them.

Both read the stored per-pool rollup. `byGpuModel` sums only each pool's `gpu` row, and
pools without a GPU model count under `other`.
"""

from __future__ import annotations

from typing import Any

from coordinator.api.context import CallContext
from coordinator.api.fields import PoolId, TenantId
from coordinator.api.registry import REGISTRY, ApiInput
from coordinator.domain.model import RollupRow
from coordinator.domain.rollup import sum_rows


class SummaryInput(ApiInput):
    tenant_id: TenantId


class ByPoolInput(ApiInput):
    tenant_id: TenantId
    pool_id: PoolId


_MODEL_COLUMNS = ("total", "allocatable", "allocated", "reserved", "available")


@REGISTRY.method(
    "capacity.summary",
    kind="read",
    permission="compute:capacity:read",
    scope="compute-tenant",
    input=SummaryInput,
    phase="v0.1",
)
async def summary(ctx: CallContext, body: SummaryInput) -> dict[str, Any]:
    """Every pool the tenant owns or is offered with its rollup rows, plus whole-GPU
    totals per GPU model.

    Archived pools appear only for their owner."""
    pools = await ctx.ledger.pools.list_visible(body.tenant_id)
    rows = await ctx.ledger.rollup(p.pool_id for p in pools)
    gpu_rows: dict[str, list[RollupRow]] = {}
    for pool in pools:
        for row in rows[pool.pool_id]:
            if row.resource == "gpu":
                gpu_rows.setdefault(pool.gpu_model or "other", []).append(row)
    by_model: dict[str, dict[str, int]] = {}
    for model, model_rows in sorted(gpu_rows.items()):
        total = sum_rows(model_rows, "gpu")
        by_model[model] = {c: getattr(total, c) for c in _MODEL_COLUMNS}
    return {
        "tenantId": body.tenant_id,
        "pools": [
            {
                "poolId": p.pool_id,
                "name": p.name,
                "gpuModel": p.gpu_model,
                "owner": p.owner,
                "archived": p.archived,
                "capacity": [r.to_api() for r in rows[p.pool_id]],
            }
            for p in pools
        ],
        "byGpuModel": by_model,
    }


@REGISTRY.method(
    "capacity.byPool",
    kind="read",
    permission="compute:capacity:read",
    scope="compute-pool",
    input=ByPoolInput,
    phase="v0.2",
)
async def by_pool(ctx: CallContext, body: ByPoolInput) -> dict[str, Any]:
    """One pool's rollup rows, one per resource, ordered by resource name.

    NOT_FOUND when the pool is not owned by or offered to the tenant, or is archived and
    the tenant is not its owner."""
    pool = ctx.require_pool()
    rows = (await ctx.ledger.rollup([pool.pool_id]))[pool.pool_id]
    return {"poolId": pool.pool_id, "rows": [r.to_api() for r in rows]}
