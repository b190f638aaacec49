"""Expected node shapes in the ledger: what operators set, per pool or per host profile
version (`coordinator.domain.shapes` judges a node against them when its inventory is
recorded)."""

from __future__ import annotations

from sqlalchemy import delete, select

from coordinator.domain.shapes import ExpectedShape
from coordinator.ledger import schema
from coordinator.ledger.database import Database


class ShapeRepo:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def set(self, shape: ExpectedShape) -> None:
        """Replace the shape of its pool or profile version; no counts: none expected."""
        e = schema.expected_shapes.c
        key = (
            (e.pool_id == shape.pool_id)
            & (e.profile_id == shape.profile_id)
            & (e.profile_version == shape.profile_version)
        )
        async with self._db.transaction() as conn:
            await conn.execute(delete(schema.expected_shapes).where(key))
            if shape.counts:
                await conn.execute(
                    schema.expected_shapes.insert().values(
                        pool_id=shape.pool_id,
                        profile_id=shape.profile_id,
                        profile_version=shape.profile_version,
                        counts=dict(sorted(shape.counts.items())),
                        updated_at=shape.updated_at,
                        updated_by=shape.updated_by,
                    )
                )

    async def list_all(self) -> list[ExpectedShape]:
        e = schema.expected_shapes.c
        async with self._db.read() as conn:
            rows = await conn.execute(
                select(schema.expected_shapes).order_by(e.pool_id, e.profile_id, e.profile_version)
            )
            return [
                ExpectedShape(
                    r.pool_id,
                    r.profile_id,
                    r.profile_version,
                    dict(r.counts),
                    r.updated_at,
                    r.updated_by,
                )
                for r in rows.all()
            ]
