"""Raw SQL on a test's database, for tests that check what the ledger stored beneath
its public surface (the ledger's own connection is private to it), and the statements
the ledger sends and the pooled connections it takes, for tests of how many it costs."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

from sqlalchemy import Engine, Pool, event

from coordinator.ledger import Database


@asynccontextmanager
async def database(url: str) -> AsyncIterator[Database]:
    db = Database(url)
    try:
        yield db
    finally:
        await db.dispose()


@contextmanager
def statements() -> Iterator[list[str]]:
    """Every statement any engine of this process sends while inside, in order."""
    seen: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        seen.append(statement)

    event.listen(Engine, "before_cursor_execute", count)
    try:
        yield seen
    finally:
        event.remove(Engine, "before_cursor_execute", count)


@contextmanager
def checkouts() -> Iterator[list[Any]]:
    """Every connection any pool of this process hands out while inside."""
    taken: list[Any] = []

    def count(dbapi_conn: Any, *rest: Any) -> None:
        taken.append(dbapi_conn)

    event.listen(Pool, "checkout", count)
    try:
        yield taken
    finally:
        event.remove(Pool, "checkout", count)
