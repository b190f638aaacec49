"""Raw SQL on a test's database, for tests that check what the ledger stored beneath
its public surface (the ledger's own connection is private to it)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from coordinator.ledger import Database


@asynccontextmanager
async def database(url: str) -> AsyncIterator[Database]:
    db = Database(url)
    try:
        yield db
    finally:
        await db.dispose()
