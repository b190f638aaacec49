"""Alembic's environment: runs the revisions on the connection the runner hands over
(`migrations.migrate`), inside the runner's transaction. There is no alembic.ini and no
URL here: the coordinator migrates its own database at start."""

from __future__ import annotations

from alembic import context

from coordinator.ledger import schema


def _run() -> None:
    if context.is_offline_mode():
        raise RuntimeError("offline (--sql) migrations are not supported")
    attributes = context.config.attributes
    context.configure(
        connection=attributes["connection"],
        target_metadata=schema.metadata,
        # SQLite alters a table by copying it; autogenerate should write batch operations.
        render_as_batch=True,
        on_version_apply=attributes["on_version_apply"],
    )
    with context.begin_transaction():
        context.run_migrations()


_run()
