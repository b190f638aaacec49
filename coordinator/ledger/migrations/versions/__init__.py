"""Alembic revisions of the ledger, oldest first; loaded by Alembic, never imported."""
