"""Roles, permissions and the `permission @ scope` decision of the seed.

A pool the tenant cannot see is NOT_FOUND (never a hint that it exists); a tenantId the
key may not act for is PERMISSION_DENIED. Operators act for any tenant. Observers (the
Slurm bridge, dashboards, scrapers) read what any tenant may read, for every tenant,
and write nothing: their role grants no write permission, and reading every tenant's
never lets a key write for another tenant.
"""

from __future__ import annotations

from coordinator.api.http.registry import Method
from coordinator.api.shapes.base import ApiInput
from coordinator.domain.errors import NotFound, PermissionDenied, Unauthenticated
from coordinator.domain.model import Pool, Principal
from coordinator.ledger import Ledger

TENANT_PERMISSIONS = frozenset(
    {
        "compute:capacity:read",
        "compute:reservations:read",
        "compute:reservations:write",
        "compute:pools:read",
        "compute:pools:write",
        "compute:nodes:read",
    }
)
OBSERVER_PERMISSIONS = frozenset(p for p in TENANT_PERMISSIONS if p.endswith(":read"))
ROLE_PERMISSIONS: dict[str, frozenset[str]] = {
    "tenant": TENANT_PERMISSIONS,
    "operator": TENANT_PERMISSIONS | {"platform:admin"},
    "observer": OBSERVER_PERMISSIONS,
}


def bearer_key(authorization: str | None, x_api_key: str | None) -> str:
    if authorization:
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
        raise Unauthenticated("Authorization header must be 'Bearer <key>'")
    if x_api_key:
        return x_api_key.strip()
    raise Unauthenticated("missing API key (Authorization: Bearer <key> or X-API-Key)")


async def authenticate(ledger: Ledger, key: str) -> Principal:
    principal = await ledger.keys.authenticate(key)
    if principal is None:
        raise Unauthenticated("invalid or revoked API key")
    return principal


def has_permission(principal: Principal, permission: str) -> bool:
    return any(permission in ROLE_PERMISSIONS.get(role, frozenset()) for role in principal.roles)


def may_act_for(principal: Principal, tenant_id: str, kind: str = "write") -> bool:
    """Whether the key may call a method of `kind` ("read"/"write") for `tenant_id`."""
    if principal.is_operator or principal.tenant_id == tenant_id:
        return True
    return kind == "read" and principal.is_observer


async def authorize(
    method: Method, principal: Principal, body: ApiInput, ledger: Ledger
) -> Pool | None:
    """Decide `method.permission @ method.scope` for this caller and input; returns the
    pool for pool-scoped methods."""
    if not has_permission(principal, method.permission):
        raise PermissionDenied(f"{method.permission} is not granted to this key")
    if method.scope in ("platform", "caller-tenant"):
        return None
    tenant_id: str | None = getattr(body, "tenant_id")  # noqa: B009 - tenant-scoped inputs have it
    if tenant_id is None:
        # Where an input lets tenantId be left out, that means every tenant's.
        if not (principal.is_operator or (method.kind == "read" and principal.is_observer)):
            raise PermissionDenied(
                "tenantId is required (only an operator or observer key may leave it out)"
            )
        return None
    if not may_act_for(principal, tenant_id, method.kind):
        raise PermissionDenied(f"this key may not act for tenant {tenant_id!r}")
    if method.scope == "compute-tenant":
        return None
    pool_id: str = getattr(body, "pool_id")  # noqa: B009
    pool = await ledger.pools.get(pool_id)
    if pool is None or not pool.visible_to(tenant_id):
        raise NotFound(f"pool {pool_id} not found")
    return pool
