"""What makes a write exactly-once: replaying the answer recorded under an idempotency
key, and retrying a unit of work that lost a race to a concurrent writer."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from coordinator.ledger import WriteRaced

T = TypeVar("T")
RETRIES = 3


@dataclass(frozen=True, slots=True)
class Replayed:
    """The answer first given for this key and body, status and JSON body verbatim."""

    status: int
    body: Any


async def retrying(attempt: Callable[[], Awaitable[T]]) -> T:
    """Run `attempt` (one unit of work) again while a concurrent writer beat it; on the
    retry it sees what the winner committed (a recorded answer, a taken atom)."""
    for tries in range(1, RETRIES + 1):
        try:
            return await attempt()
        except WriteRaced:
            if tries == RETRIES:
                raise
    raise AssertionError("unreachable")
