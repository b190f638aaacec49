"""The heap's generations: which long-lived objects the cyclic collector's full pass
skips, and for how long at most.

A pool cache of 1,000 nodes is ~150,000 tracked objects (nodes, ~9,000 atoms, their
claims) that live until the pool's nodes or bookings change, and every full pass of the
collector walked all of them: 190 ms inside a 32-client run of 512 creates that took
330 ms without it (bench/README.md, issue 30 point 8). So after a pool is reloaded its
objects, with everything else alive then, are frozen (`gc.freeze`: the full pass skips
them), the young generations collected first so that no fresh garbage is kept.

What freezing costs: a cycle among frozen objects that dies later is not collected
while it stays frozen (reference counting still frees everything else, the replaced
pool caches included: they hold no cycle). So what a freeze keeps is bounded in time:
a reload at least `refresh_ms` after the last full collection unfreezes the heap,
collects it whole and freezes again, and closing the ledger unfreezes and collects.
The decision (`step`) takes the time as an argument; `reloaded` and `release` do it.
"""

from __future__ import annotations

import gc
from enum import Enum


class Step(Enum):
    NOTHING = "nothing"  # freezing is off
    FREEZE = "freeze"  # collect the young generations, freeze what is left
    REFRESH = "refresh"  # unfreeze, collect everything, freeze what is left


class HeapGenerations:
    """Freezes the heap after pool reloads, with a full collection at most every
    `refresh_ms` (0: never freeze). One per process is enough: the freeze is global."""

    def __init__(self, refresh_ms: int) -> None:
        if refresh_ms < 0:
            raise ValueError(f"refresh_ms must be >= 0, got {refresh_ms}")
        self.refresh_ms = refresh_ms
        # When the heap was last collected whole; None: not since this began.
        self.refreshed_at: int | None = None
        self.freezes = 0
        self.refreshes = 0

    def step(self, now: int) -> Step:
        """What a reload at `now` (ms) calls for, and that it was done."""
        if self.refresh_ms == 0:
            return Step.NOTHING
        if self.refreshed_at is None or now - self.refreshed_at >= self.refresh_ms:
            self.refreshed_at = now
            self.refreshes += 1
            return Step.REFRESH
        self.freezes += 1
        return Step.FREEZE

    def reloaded(self, now: int) -> None:
        """A pool cache was (re)loaded at `now`: its objects are long-lived."""
        step = self.step(now)
        if step is Step.REFRESH:
            gc.unfreeze()
            gc.collect()
        elif step is Step.FREEZE:
            gc.collect(1)
        else:
            return
        gc.freeze()

    def release(self) -> None:
        """The caches go (the ledger closes): nothing stays frozen, and whatever died
        among the frozen objects is collected now."""
        if self.refresh_ms and self.refreshed_at is not None:
            gc.unfreeze()
            gc.collect()
            self.refreshed_at = None
