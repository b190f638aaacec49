"""Projects: a tenant's own groupings of reservations, `prj_` + ULID, each with a name
unique within its tenant (so a client may name one instead of giving its id)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Row, select
from sqlalchemy.exc import IntegrityError

from coordinator.domain.errors import Conflict
from coordinator.domain.model import Project
from coordinator.ledger import schema
from coordinator.ledger.database import Database


def _project(row: Row[Any]) -> Project:
    return Project(row.project_id, row.tenant_id, row.name, row.created_at)


class ProjectRepo:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def create(self, project: Project) -> Project:
        """Store a new project; ALREADY_EXISTS when its tenant has one of that name."""
        try:
            async with self._db.transaction() as conn:
                await conn.execute(
                    schema.projects.insert().values(
                        project_id=project.project_id, tenant_id=project.tenant_id,
                        name=project.name, created_at=project.created_at,
                    )
                )  # fmt: skip
        except IntegrityError as exc:
            raise Conflict(
                f"tenant {project.tenant_id!r} already has a project named {project.name!r}"
            ) from exc
        return project

    async def list(self, tenant_id: str | None) -> list[Project]:
        """A tenant's projects (None: every tenant's), by tenant then name."""
        p = schema.projects.c
        query = select(schema.projects).order_by(p.tenant_id, p.name)
        if tenant_id is not None:
            query = query.where(p.tenant_id == tenant_id)
        async with self._db.read() as conn:
            return [_project(row) for row in (await conn.execute(query)).all()]
