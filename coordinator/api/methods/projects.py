"""projects.create/list: a tenant's own groupings of reservations (SPEC §1 "Project").

A tenant issues its projects (an operator for any tenant): `prj_` + ULID, with a name
unique within the tenant, so clients may name one where a project id is asked.
Reservations name their project by id, as before.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator

from coordinator.api.http.context import CallContext
from coordinator.api.http.registry import REGISTRY
from coordinator.api.shapes import admin_outputs as out
from coordinator.api.shapes.base import ApiInput
from coordinator.api.shapes.fields import TenantId
from coordinator.domain.model import Project

ProjectName = Annotated[
    str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
]


class ProjectCreateInput(ApiInput):
    tenant_id: TenantId = Field(description="The tenant whose project it is.")
    name: ProjectName = Field(
        description="Its name, unique within the tenant (letters, digits, . _ -; not prj_…).",
        examples=["llm-pretrain"],
    )

    @field_validator("name")
    @classmethod
    def _not_an_id(cls, value: str) -> str:
        # A name never passes for a project id in a client that takes either.
        if value.startswith("prj_"):
            raise ValueError("a project's name may not start with prj_ (ids do)")
        return value


class ProjectListInput(ApiInput):
    tenant_id: TenantId | None = Field(
        default=None, description="The tenant; absent (operators only): every tenant's."
    )


def project_out(p: Project) -> out.ProjectOut:
    return out.ProjectOut(
        project_id=p.project_id, tenant_id=p.tenant_id, name=p.name, created_at=p.created_at
    )


@REGISTRY.method(
    "projects.create", kind="write", permission="compute:reservations:write",
    scope="compute-tenant", input=ProjectCreateInput, output=out.ProjectOut,
)  # fmt: skip
async def projects_create(ctx: CallContext, body: ProjectCreateInput) -> out.ProjectOut:
    """Create a project of the tenant: its id (`prj_` + ULID) is in the answer; a name
    the tenant already has is ALREADY_EXISTS."""
    return project_out(await ctx.services.tenancy.create_project(body.tenant_id, body.name))


@REGISTRY.method(
    "projects.list", kind="read", permission="compute:reservations:read",
    scope="compute-tenant", input=ProjectListInput, output=out.ProjectList,
)  # fmt: skip
async def projects_list(ctx: CallContext, body: ProjectListInput) -> out.ProjectList:
    """The tenant's projects by name (operators may leave out tenantId: every tenant's)."""
    found = await ctx.ledger.projects.list(body.tenant_id)
    return out.ProjectList(projects=[project_out(p) for p in found])
