"""The ledger as a resource: opened (and migrated), the bootstrap operator ensured, this
replica's leadership contender; closed in reverse on the way out."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass

from coordinator.config import CoordinatorSettings
from coordinator.ledger import Leadership, Ledger
from coordinator.runtime.heap import HeapGenerations
from coordinator.tasks.idempotency_purge import IdempotencyPurge
from coordinator.tasks.shutdown import bounded
from procs.settings import ConfigError
from shared.clock import Clock

OPERATOR_TENANT = "operator"


@dataclass(frozen=True, slots=True)
class Store:
    ledger: Ledger
    leadership: Leadership
    idempotency_purge: IdempotencyPurge


async def bootstrap_operator(ledger: Ledger, key: str, now: int) -> None:
    await ledger.tenants.ensure(OPERATOR_TENANT, "platform operator", now)
    try:
        await ledger.keys.ensure(key, OPERATOR_TENANT, frozenset({"operator"}), "bootstrap", now)
    except ValueError as exc:
        raise ConfigError("bootstrap_operator_key", str(exc)) from None


@asynccontextmanager
async def ledger_context(
    settings: CoordinatorSettings, clock: Clock, replica: str
) -> AsyncIterator[Store]:
    async with AsyncExitStack() as stack:
        ledger = await Ledger.open(
            settings.effective_database_url,
            application_name=f"gpufleet-coordinator {replica}",
            heap=HeapGenerations(int(settings.heap_refresh_s * 1000)),
        )
        stack.push_async_callback(bounded("ledger", ledger.close))
        # Built first: a retention below the SPEC's 24 h is refused before anything runs.
        purge = IdempotencyPurge(ledger, clock, int(settings.idempotency_keep_s * 1000))
        if settings.bootstrap_operator_key:
            await bootstrap_operator(ledger, settings.bootstrap_operator_key, clock.now_ms())
        leadership = ledger.leadership(holder=replica)
        stack.push_async_callback(bounded("leadership", leadership.close))
        yield Store(ledger, leadership, purge)
