"""The `idempotency-purge` loop's body: idempotency records past their retention are
dropped, so the table holds about one retention's worth of writes. The SPEC promises a
key is kept at least 24 h; the retention may be longer, never shorter."""

from __future__ import annotations

import logging

from coordinator.ledger import Ledger
from shared.clock import Clock

log = logging.getLogger(__name__)

SPEC_RETENTION_MS = 24 * 3600 * 1000


class IdempotencyPurge:
    def __init__(self, ledger: Ledger, clock: Clock, keep_ms: int = SPEC_RETENTION_MS) -> None:
        if keep_ms < SPEC_RETENTION_MS:
            raise ValueError(
                f"idempotency retention {keep_ms} ms is below the 24 h the SPEC promises"
            )
        self.ledger = ledger
        self.clock = clock
        self.keep_ms = keep_ms

    async def tick(self) -> None:
        dropped = await self.ledger.purge_idempotency(self.clock.now_ms(), self.keep_ms)
        if dropped:
            log.info("dropped %d idempotency records older than %d ms", dropped, self.keep_ms)
