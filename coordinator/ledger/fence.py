"""Fencing: a leader that lost its lock writes nothing once another replica leads.

The leader lock is a session advisory lock on one dedicated connection
(`coordinator.ledger.leadership`), but leader writes run on pooled connections, so the
lock alone cannot stop a leader whose lock session died from writing on: it learns of
the loss only at its next check. So every leader write transaction (a loop run under
`Leadership.fenced()`) begins with one statement that

- holds the `leader_term` row FOR SHARE until the transaction ends, and reads its
  `epoch`: a replica taking over bumps the epoch first, and that UPDATE waits for every
  transaction of the old leader still in flight; once bumped, the old leader's next
  transaction reads an epoch that is not its own;
- checks in `pg_locks` that the session this replica took the lock on still holds it:
  a leader whose lock session was terminated stops at its next transaction even before
  anyone else takes over.

Either failing rolls the transaction back with `NotLeader`, and the replica steps down
at once. So two leaders never write at once, and after a takeover the old leader writes
nothing. SQLite has one coordinator, which always leads: no check.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.domain.errors import Unavailable


class NotLeader(Unavailable):
    """This replica no longer leads; the leader write was refused and rolled back."""


@dataclass(frozen=True, slots=True)
class FenceToken:
    """What a leader holds: the lock's key, the backend pid that holds it, and the
    epoch it bumped the term to when it took over."""

    key: int
    pid: int
    epoch: int


class Fence(Protocol):
    def token(self) -> FenceToken | None: ...

    def lost(self, why: str) -> None: ...


_FENCE: ContextVar[Fence | None] = ContextVar("gpufleet_fence", default=None)

_CHECK = (
    "SELECT t.epoch, EXISTS (SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory'"
    " AND l.classid = $1 AND l.objid = $2 AND l.objsubid = 1 AND l.pid = $3 AND l.granted)"
    " FROM leader_term t WHERE t.term_id = 1 FOR SHARE OF t"
)


@contextmanager
def fenced(fence: Fence) -> Iterator[None]:
    """Every ledger transaction opened inside is a leader write, checked first."""
    reset = _FENCE.set(fence)
    try:
        yield
    finally:
        _FENCE.reset(reset)


async def check_fence(conn: AsyncConnection) -> None:
    """Run first in every transaction; a no-op outside a fenced scope and on SQLite."""
    fence = _FENCE.get()
    if fence is None or conn.dialect.name != "postgresql":
        return
    token = fence.token()
    if token is None:
        raise NotLeader("this coordinator is not the leader")
    classid, objid = (token.key >> 32) & 0xFFFFFFFF, token.key & 0xFFFFFFFF
    row: Any = (await conn.exec_driver_sql(_CHECK, (classid, objid, token.pid))).first()
    epoch, holds = (None, False) if row is None else (row[0], row[1])
    if epoch != token.epoch:
        why = f"another coordinator took over (epoch {epoch})"
    elif not holds:
        why = "the leader lock's session is gone"
    else:
        return
    fence.lost(why)
    raise NotLeader(f"leader write refused: {why}")
