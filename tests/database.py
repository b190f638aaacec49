"""Raw SQL on a test's database, for tests that check what the ledger stored beneath
its public surface (the ledger's own connection is private to it), and the statements
the ledger sends and the pooled connections it takes, for tests of how many it costs."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager
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
def _recorded(target: Any, name: str, pick: Callable[..., Any]) -> Iterator[list[Any]]:
    """What `pick` takes from each `name` event of `target` while inside, in order."""
    seen: list[Any] = []

    def record(*args: Any) -> None:
        seen.append(pick(*args))

    event.listen(target, name, record)
    try:
        yield seen
    finally:
        event.remove(target, name, record)


def statements() -> AbstractContextManager[list[str]]:
    """Every statement any engine of this process sends while inside, in order."""
    return _recorded(Engine, "before_cursor_execute", lambda conn, cursor, sql, *rest: sql)


def checkouts() -> AbstractContextManager[list[Any]]:
    """Every connection any pool of this process hands out while inside."""
    return _recorded(Pool, "checkout", lambda dbapi_conn, *rest: dbapi_conn)
