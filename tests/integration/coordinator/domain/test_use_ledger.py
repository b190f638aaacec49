"""Use accounting through the ledger, on SQLite and PostgreSQL (SPEC §10): whatever the
bookings, processes and pass times, the buckets the use pass adds to in place read back
as the sum of what each pass accrued, and the report's arithmetic on them holds: used ≤
booked per reservation, used ≤ booked + unbooked, weighted ≤ used."""

from __future__ import annotations

import asyncio
import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.domain.gpu_use_accrual import HOUR_MS, AccrualKey, AccrualWho, Accrued, accrue
from coordinator.domain.gpu_use_report import reservation_use
from coordinator.ledger import Ledger
from shared.wire import DeviceUse, ProcessUse
from tests.unit.coordinator.domain.test_use_accounting import (
    NODE,
    POOL,
    UNITS,
    _add,
    _during,
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

            @settings(max_examples=60, deadline=None)
            @given(holds_st, passes_st, st.integers(0, 3 * HOUR_MS), st.integers(1, 3 * HOUR_MS))
            def check(
                raw: list[tuple[str, str, int, int]],
                passes: list[tuple[int, set[str], int]],
                w_off: int,
                w_len: int,
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
                    procs = (ProcessUse(pid=1),)
                    uses = {
                        NODE: {
                            u: DeviceUse(
                                device_id=u,
                                sm_util=util if util % 7 else None,
                                processes=procs if u in busy else (),
                            )
                            for u in UNITS
                        }
                    }
                    accrued = accrue(uses, _during(holds, a, now), {NODE: POOL}, {NODE: (a, now)})
                    _add(total, accrued)
                    runner.run(ledger.gpu_use.record(accrued, [], []))
                read = runner.run(ledger.gpu_use.buckets(base, now + HOUR_MS))
                assert sorted(
                    (b.hour, b.reservation_id, b.used_ms, b.weighted_ms, b.unknown_ms) for b in read
                ) == sorted(
                    (k.hour, k.reservation_id, v.used_ms, v.weighted_ms, v.unknown_ms)
                    for k, v in total.items()
                )
                rows, free = reservation_use([_span(h) for h in holds], read, base, now, now)
                # The report's read (whole hours summed by the database) says the same
                # for any window.
                inside = base + w_off % max(1, now - base)  # a window ending before now too
                for w_start, w_end in ((base, now), (inside, min(now - 1, inside + w_len))):
                    stop = min(w_end, now)
                    summed = runner.run(ledger.gpu_use.summed(w_start, stop))
                    spans = [_span(h) for h in holds]
                    assert reservation_use(spans, summed, w_start, w_end, now) == reservation_use(
                        spans, read, w_start, w_end, now
                    )
                for r in rows:
                    # Utilizations that are multiples of 7 stand for "no figure" (MIG).
                    assert 0 <= (r.weighted_ms or 0) <= r.used_ms <= r.booked_ms
                unbooked = sum(f.used_ms for f in free)
                assert sum(r.used_ms for r in rows) <= sum(r.booked_ms for r in rows) + unbooked
                assert all(0 <= (f.weighted_ms or 0) <= f.used_ms for f in free)

            check()
        finally:
            runner.run(ledger.close())


async def test_a_report_window_sums_whole_hours_and_prorates_the_cut_ones(
    database_url: str,
) -> None:
    """Unbooked use of 40 min in each of three hours; a window from half past the first
    to half past the third counts half, all, half: 80 min, however the hours are read."""
    ledger = await Ledger.open(database_url)
    try:
        t0 = 500 * HOUR_MS
        who = AccrualWho(POOL, None)
        for h in range(3):
            key = AccrualKey(t0 + h * HOUR_MS, "", NODE, "GPU-0", "gpu", "")
            await ledger.gpu_use.record({key: Accrued(who, 40 * 60_000, 20 * 60_000)}, [], [])
        start, end, now = t0 + HOUR_MS // 2, t0 + 5 * HOUR_MS // 2, t0 + 10 * HOUR_MS
        summed = await ledger.gpu_use.summed(start, min(end, now))
        assert len(summed) == 3  # the whole hour summed, the two cut ones as they are
        _, free = reservation_use([], summed, start, end, now)
        assert [(f.used_ms, f.weighted_ms) for f in free] == [(80 * 60_000, 40 * 60_000)]
        raw = await ledger.gpu_use.buckets(start, end)
        assert reservation_use([], raw, start, end, now) == reservation_use(
            [], summed, start, end, now
        )
    finally:
        await ledger.close()
