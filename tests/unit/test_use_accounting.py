"""Use accounting as properties (SPEC §10): whatever the bookings, processes and pass
times, a reservation's used time never exceeds its booked time, all use is at most
booked plus unbooked, and weighted time never exceeds used time; plus the arithmetic on
a worked example."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.domain.booked_hours import UsageSpan
from coordinator.domain.gpu_use_accrual import HOUR_MS, UNBOOKED, AccrualKey, Accrued, accrue
from coordinator.domain.gpu_use_join import Hold
from coordinator.domain.gpu_use_report import UseHour, reservation_use
from shared.wire import DeviceUse, ProcessUse

UNITS = ("GPU-0", "GPU-1", "GPU-2", "GPU-3")
NODE, POOL = "n1", "pool-a"


def _hold(rid: str, cls: str, units: tuple[str, ...], start: int, end: int) -> Hold:
    return Hold(rid, "acme", None, POOL, NODE, cls, units, start, end)


def _span(h: Hold) -> UsageSpan:
    # A whole-node booking is one node-unit; any other one unit of its class.
    return UsageSpan("acme", POOL, None, h.resource, 1, h.start, h.end, h.reservation_id)


def _buckets(total: dict[AccrualKey, Accrued]) -> list[UseHour]:
    return [
        UseHour(k.hour, k.reservation_id, v.who.tenant_id, v.who.pool_id, v.who.project_id,
               k.resource, v.used_ms, v.weighted_ms)
        for k, v in total.items()
    ]  # fmt: skip


def _add(total: dict[AccrualKey, Accrued], more: dict[AccrualKey, Accrued]) -> None:
    for k, v in more.items():
        acc = total.setdefault(k, Accrued(v.who))
        acc.used_ms += v.used_ms
        acc.weighted_ms += v.weighted_ms


holds_st = st.lists(
    st.tuples(
        st.sampled_from(("gpu", "node")),
        st.sampled_from(UNITS),
        st.integers(0, 3 * HOUR_MS),
        st.integers(1, 2 * HOUR_MS),
    ),
    max_size=4,
)
passes_st = st.lists(
    st.tuples(
        st.integers(1, 20 * 60_000),  # time to the next pass
        st.sets(st.sampled_from(UNITS)),  # units with a process
        st.integers(0, 100),  # their utilization
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=300, deadline=None)
@given(holds_st, passes_st, st.integers(0, 4 * HOUR_MS), st.integers(1, 4 * HOUR_MS))
def test_used_is_at_most_booked_plus_unbooked_and_weighted_at_most_used(
    raw: list[tuple[str, str, int, int]],
    passes: list[tuple[int, set[str], int]],
    w_start: int,
    w_len: int,
) -> None:
    holds = [
        _hold(f"rsv-{i}", cls, UNITS if cls == "node" else (unit,), start, start + length)
        for i, (cls, unit, start, length) in enumerate(raw)
    ]
    now = 0
    total: dict[AccrualKey, Accrued] = {}
    for gap, busy, util in passes:
        a, now = now, now + gap
        live = [h for h in holds if h.start <= now < h.end]
        uses = {
            NODE: {
                u: DeviceUse(
                    device_id=u, sm_util=util,
                    processes=(ProcessUse(pid=1),) if u in busy else (),
                )
                for u in UNITS
            }
        }  # fmt: skip
        _add(total, accrue(uses, live, {NODE: POOL}, {NODE: (a, now)}))
    for v in total.values():
        assert 0 <= v.weighted_ms <= v.used_ms
    # Before any cap: every reservation's accrued use fits in its booked time.
    spans = [_span(h) for h in holds]
    booked_all, _ = reservation_use(spans, [], 0, now, now)
    booked = {r.reservation_id: r.booked_ms for r in booked_all}
    accrued: dict[str, int] = {}
    for k, v in total.items():
        if k.reservation_id != UNBOOKED:
            accrued[k.reservation_id] = accrued.get(k.reservation_id, 0) + v.used_ms
    for rid, used in accrued.items():
        assert used <= booked.get(rid, 0), rid
    # Any window of the report.
    start, end = w_start, w_start + w_len
    rows, free = reservation_use(spans, _buckets(total), start, end, now)
    for r in rows:
        assert 0 <= r.weighted_ms <= r.used_ms <= r.booked_ms
    for f in free:
        assert 0 <= f.weighted_ms <= f.used_ms
    # All use in the window is at most the booked plus the unbooked time of the units.
    busy_ms = sum(r.used_ms for r in rows) + sum(f.used_ms for f in free)
    assert busy_ms <= sum(r.booked_ms for r in rows) + sum(f.used_ms for f in free)


def test_a_worked_example_of_used_weighted_and_unbooked_hours() -> None:
    """GPU-0 booked 10:00-11:00 and busy at 50 % from 10:30 to 11:30: half an hour used
    (a quarter weighted) by the booking, half an hour unbooked; a whole-node booking's
    use counts per GPU as a share of the node."""
    t0 = 10 * HOUR_MS
    gpu = _hold("rsv-gpu", "gpu", ("GPU-0",), t0, t0 + HOUR_MS)
    node = _hold("rsv-node", "node", UNITS, t0, t0 + 2 * HOUR_MS)
    busy = {
        NODE: {"GPU-0": DeviceUse(device_id="GPU-0", sm_util=50, processes=(ProcessUse(pid=1),))}
    }
    total: dict[AccrualKey, Accrued] = {}
    for a in range(t0 + HOUR_MS // 2, t0 + 3 * HOUR_MS // 2, 60_000):
        live = [h for h in (gpu,) if h.start <= a < h.end]
        _add(total, accrue(busy, live, {NODE: POOL}, {NODE: (a, a + 60_000)}))
    rows, free = reservation_use(
        [_span(gpu)], _buckets(total), t0, t0 + 2 * HOUR_MS, t0 + 2 * HOUR_MS
    )
    assert [(r.reservation_id, r.booked_ms, r.used_ms, r.weighted_ms) for r in rows] == [
        ("rsv-gpu", HOUR_MS, HOUR_MS // 2, HOUR_MS // 4)
    ]
    assert [(f.pool_id, f.used_ms, f.weighted_ms) for f in free] == [
        (POOL, HOUR_MS // 2, HOUR_MS // 4)
    ]
    shared = accrue(busy, [node], {NODE: POOL}, {NODE: (t0, t0 + 60_000)})
    assert [(k.reservation_id, v.used_ms) for k, v in shared.items()] == [("rsv-node", 15_000)]
