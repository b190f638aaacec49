"""Operator methods: tenants, API keys and quotas."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from coordinator.api.http.context import CallContext
from coordinator.api.http.registry import REGISTRY
from coordinator.api.shapes import admin_outputs as out
from coordinator.api.shapes.base import ApiInput
from coordinator.api.shapes.fields import PoolId, TenantId
from coordinator.domain.errors import NotFound
from coordinator.domain.model import RESOURCES, ApiKey, Quota

Role = Literal["tenant", "operator", "observer"]


def _default_roles() -> list[Role]:
    return ["tenant"]


Name = Annotated[str, Field(min_length=1, max_length=256)]


class TenantCreateInput(ApiInput):
    tenant_id: TenantId = Field(description="The new tenant's id.")
    name: Name | None = Field(default=None, description="Its name (default: its id).")


class ApiKeyCreateInput(ApiInput):
    tenant_id: TenantId = Field(description="The tenant the key acts for.")
    roles: Annotated[list[Role], Field(min_length=1, max_length=2)] = Field(
        default_factory=_default_roles,
        description="Its roles (operator: every tenant; observer: reads every tenant's,"
        " writes nothing, and goes alone).",
    )
    label: Annotated[str, Field(max_length=256)] = Field(
        default="", description="A label to recognise it by."
    )

    @field_validator("roles")
    @classmethod
    def _observer_alone(cls, roles: list[Role]) -> list[Role]:
        # Read-only means nothing else: tenant + observer would write for its own
        # tenant while reading everyone's, which no service needs.
        if "observer" in roles and len(set(roles)) > 1:
            raise ValueError("an observer key has no other role")
        return roles


class QuotaSetInput(ApiInput):
    tenant_id: TenantId = Field(description="The tenant limited.")
    pool_id: PoolId | None = Field(
        default=None, description="The pool; absent: the limit holds across all its pools."
    )
    resource: Literal[RESOURCES] = Field(  # type: ignore[valid-type]
        description="The resource limited.", examples=["gpu"]
    )
    limit: Annotated[int, Field(ge=0, le=1 << 40)] = Field(
        description="The most it may book at once, in the resource's units.", examples=[8]
    )


class ApiKeyRevokeInput(ApiInput):
    key_id: Annotated[str, Field(min_length=16, max_length=16)] = Field(
        description="The key's id (not the key).", examples=["k0123456789abcde"]
    )


@REGISTRY.method(
    "tenants.create",
    kind="write",
    permission="platform:admin",
    scope="platform",
    input=TenantCreateInput,
    output=out.TenantOut,
)
async def tenants_create(ctx: CallContext, body: TenantCreateInput) -> out.TenantOut:
    """Create a tenant (operator)."""
    t = await ctx.services.tenancy.create_tenant(body.tenant_id, body.name or body.tenant_id)
    return out.TenantOut(tenant_id=t.tenant_id, name=t.name, created_at=t.created_at)


@REGISTRY.method(
    "apiKeys.create",
    kind="write",
    permission="platform:admin",
    scope="platform",
    input=ApiKeyCreateInput,
    output=out.ApiKeyCreated,
)
async def api_keys_create(ctx: CallContext, body: ApiKeyCreateInput) -> out.ApiKeyCreated:
    """Create an API key for a tenant (operator). The key is shown once, stored hashed."""
    issued = await ctx.services.tenancy.issue_key(body.tenant_id, frozenset(body.roles), body.label)
    return out.ApiKeyCreated(
        key_id=issued.key_id, key=issued.key, tenant_id=body.tenant_id, roles=sorted(body.roles)
    )


@REGISTRY.method(
    "apiKeys.revoke",
    kind="write",
    permission="platform:admin",
    scope="platform",
    input=ApiKeyRevokeInput,
    output=out.ApiKeyRevoked,
)
async def api_keys_revoke(ctx: CallContext, body: ApiKeyRevokeInput) -> out.ApiKeyRevoked:
    """Revoke an API key (operator); it stops working at once."""
    await ctx.services.tenancy.revoke_key(body.key_id)
    return out.ApiKeyRevoked(key_id=body.key_id, revoked=True)


@REGISTRY.method(
    "quotas.set",
    kind="write",
    permission="platform:admin",
    scope="platform",
    input=QuotaSetInput,
    output=out.Quotas,
    phase="v0.2",
)
async def quotas_set(ctx: CallContext, body: QuotaSetInput) -> out.Quotas:
    """Set a tenant's limit on a resource, in one pool or across its pools (operator).

    For `memoryGiB` it is also the `max_memory_gb` of interval reservations."""
    quotas = await ctx.services.tenancy.set_quota(
        Quota(body.tenant_id, body.pool_id, body.resource, body.limit)
    )
    return out.Quotas(
        tenant_id=body.tenant_id,
        quotas=[
            out.QuotaOut(pool_id=q.pool_id, resource=q.resource, limit=q.limit) for q in quotas
        ],
    )


class TenantListInput(ApiInput):
    pass


class ApiKeyListInput(ApiInput):
    tenant_id: TenantId | None = Field(default=None, description="Absent: every tenant's keys.")
    include_revoked: bool = Field(default=False, description="List revoked keys too.")


class WhoAmIInput(ApiInput):
    pass


def key_out(key: ApiKey) -> out.ApiKeyOut:
    return out.ApiKeyOut(
        key_id=key.key_id,
        tenant_id=key.tenant_id,
        roles=sorted(key.roles),
        label=key.label,
        created_at=key.created_at,
        revoked_at=key.revoked_at,
    )


@REGISTRY.method(
    "tenants.list", kind="read", permission="platform:admin", scope="platform",
    input=TenantListInput, output=out.TenantList, phase="v0.3",
)  # fmt: skip
async def tenants_list(ctx: CallContext, body: TenantListInput) -> out.TenantList:
    """Every tenant with how many pools it owns and live keys it has (operator)."""
    tenants = await ctx.ledger.tenants.list()
    pools = await ctx.ledger.pools.list_all()
    keys = await ctx.ledger.keys.list()
    return out.TenantList(
        tenants=[
            out.TenantRow(
                tenant_id=t.tenant_id,
                name=t.name,
                created_at=t.created_at,
                pools=sum(1 for p in pools if p.owner == t.tenant_id),
                keys=sum(1 for k in keys if k.tenant_id == t.tenant_id and k.revoked_at is None),
            )
            for t in tenants
        ]
    )


@REGISTRY.method(
    "apiKeys.list", kind="read", permission="platform:admin", scope="platform",
    input=ApiKeyListInput, output=out.ApiKeyList, phase="v0.3",
)  # fmt: skip
async def api_keys_list(ctx: CallContext, body: ApiKeyListInput) -> out.ApiKeyList:
    """A tenant's API keys, or every tenant's (operator): id, roles, label, times; never
    the secret. Revoked keys only with includeRevoked."""
    if body.tenant_id is not None and await ctx.ledger.tenants.get(body.tenant_id) is None:
        raise NotFound(f"tenant {body.tenant_id!r} not found")
    keys = await ctx.ledger.keys.list(body.tenant_id)
    shown = [k for k in keys if body.include_revoked or k.revoked_at is None]
    return out.ApiKeyList(tenant_id=body.tenant_id, keys=[key_out(k) for k in shown])


@REGISTRY.method(
    "apiKeys.self", kind="read", permission="compute:capacity:read", scope="caller-tenant",
    input=WhoAmIInput, output=out.CallerKey, phase="v0.3",
)  # fmt: skip
async def api_keys_self(ctx: CallContext, body: WhoAmIInput) -> out.CallerKey:
    """The calling key: its id, tenant and roles (a CLI infers the tenant from it)."""
    p = ctx.principal
    return out.CallerKey(
        key_id=p.key_id, tenant_id=p.tenant_id, roles=sorted(p.roles), operator=p.is_operator
    )
