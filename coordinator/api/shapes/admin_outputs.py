"""Output models of the operator methods (tenants, API keys, quotas) and of projects."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from coordinator.api.shapes.base import ApiOutput
from coordinator.api.shapes.fields import EpochMs, PoolId, ProjectId, TenantId

Role = Literal["tenant", "operator", "observer"]
KeyId = Annotated[str, Field(examples=["k0123456789abcde"])]


class TenantOut(ApiOutput):
    tenant_id: TenantId = Field(description="The tenant.")
    name: str = Field(description="Its name.")
    created_at: EpochMs = Field(description="When it was created.")


class TenantRow(TenantOut):
    pools: int = Field(description="How many pools it owns.")
    keys: int = Field(description="How many live API keys it has.")


class TenantList(ApiOutput):
    tenants: list[TenantRow] = Field(description="Every tenant.")


class ApiKeyCreated(ApiOutput):
    key_id: KeyId = Field(description="The key's id (logged, shown in lists).")
    key: str = Field(
        description="The secret: shown this once, stored hashed.",
        examples=["gpf_k0123456789abcde_secret"],
    )
    tenant_id: TenantId = Field(description="Its tenant.")
    roles: list[Role] = Field(description="Its roles.")


class ApiKeyRevoked(ApiOutput):
    key_id: KeyId = Field(description="The key revoked.")
    revoked: Literal[True] = Field(description="Always true.")


class ApiKeyOut(ApiOutput):
    key_id: KeyId = Field(description="The key's id.")
    tenant_id: TenantId = Field(description="Its tenant.")
    roles: list[Role] = Field(description="Its roles.")
    label: str = Field(description="Its label.")
    created_at: EpochMs = Field(description="When it was created.")
    revoked_at: EpochMs | None = Field(description="When it was revoked (null: live).")


class ApiKeyList(ApiOutput):
    tenant_id: TenantId | None = Field(description="The tenant asked about (null: all).")
    keys: list[ApiKeyOut] = Field(description="Its keys; never their secrets.")


class CallerKey(ApiOutput):
    key_id: KeyId = Field(description="The calling key's id.")
    tenant_id: TenantId = Field(description="Its tenant.")
    roles: list[Role] = Field(description="Its roles.")
    operator: bool = Field(description="Whether it has the operator role.")


class QuotaOut(ApiOutput):
    pool_id: PoolId | None = Field(description="The pool (null: across the tenant's pools).")
    resource: str = Field(description="The resource limited.")
    limit: int = Field(description="The limit, in the resource's units.")


class Quotas(ApiOutput):
    tenant_id: TenantId = Field(description="The tenant.")
    quotas: list[QuotaOut] = Field(description="Every limit it has now.")


class ProjectOut(ApiOutput):
    project_id: ProjectId = Field(description="The project (`prj_` + ULID).")
    tenant_id: TenantId = Field(description="Its tenant.")
    name: str = Field(description="Its name, unique within its tenant.")
    created_at: EpochMs = Field(description="When it was created.")


class ProjectList(ApiOutput):
    projects: list[ProjectOut] = Field(description="By tenant, then name.")
