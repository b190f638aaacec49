"""Use accounting through the ledger, on SQLite and PostgreSQL (SPEC §10): whatever the
bookings, processes and pass times, the buckets the use pass adds to in place read back
as the sum of what each pass accrued, and the report's arithmetic on them holds: used ≤
booked per reservation, used ≤ booked + unbooked, weighted ≤ used."""

from __future__ import annotations

import asyncio
import itertools

from hypothesis import given, settings

from coordinator.domain.use_accrual import HOUR_MS, AccrualKey, Accrued, accrue
from coordinator.domain.use_report import reservation_use
from coordinator.ledger import Ledger
from shared.wire import DeviceUse, ProcessUse
from tests.unit.test_use_accounting import (
    NODE,
    POOL,
    UNITS,
    _add,
    _hold,
    _span,
    holds_st,
    passes_st,
)

# Each example accounts in its own stretch of time, so examples share one database.
_STRETCH = itertools.count(1)


def test_the_ledger_adds_up_what_each_pass_accrued(database_url: str) -> None:
    with asyncio.Runner() as runner:
        ledger = runner.run(Ledger.open(database_url))
        try:

            @settings(max_examples=40, deadline=None)
            @given(holds_st, passes_st)
            def check(
                raw: list[tuple[str, str, int, int]], passes: list[tuple[int, set[str], int]]
            ) -> None:
                base = next(_STRETCH) * 100 * HOUR_MS
                holds = [
                    _hold(f"rsv-{base}-{i}", cls, UNITS if cls == "node" else (unit,),
                          base + start, base + start + length)
                    for i, (cls, unit, start, length) in enumerate(raw)
                ]  # fmt: skip
                now = base
                total: dict[AccrualKey, Accrued] = {}
                for gap, busy, util in passes:
                    a, now = now, now + gap
                    live = [h for h in holds if h.start <= now < h.end]
                    procs = (ProcessUse(pid=1),)
                    uses = {
                        NODE: {
                            u: DeviceUse(
                                device_id=u, sm_util=util, processes=procs if u in busy else ()
                            )
                            for u in UNITS
                        }
                    }
                    accrued = accrue(uses, live, {NODE: POOL}, {NODE: (a, now)})
                    _add(total, accrued)
                    runner.run(ledger.use.record(accrued, [], []))
                read = runner.run(ledger.use.buckets(base, now + HOUR_MS))
                assert sorted(
                    (b.hour, b.reservation_id, b.used_ms, b.weighted_ms) for b in read
                ) == sorted(
                    (k.hour, k.reservation_id, v.used_ms, v.weighted_ms) for k, v in total.items()
                )
                rows, free = reservation_use([_span(h) for h in holds], read, base, now, now)
                for r in rows:
                    assert 0 <= r.weighted_ms <= r.used_ms <= r.booked_ms
                unbooked = sum(f.used_ms for f in free)
                assert sum(r.used_ms for r in rows) <= sum(r.booked_ms for r in rows) + unbooked
                assert all(0 <= f.weighted_ms <= f.used_ms for f in free)

            check()
        finally:
            runner.run(ledger.close())
