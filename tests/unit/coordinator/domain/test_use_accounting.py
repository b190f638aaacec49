"""Use accounting as properties (SPEC §10): whatever the bookings, processes and pass
times, a reservation's used time never exceeds its booked time, all use is at most
booked plus unbooked, weighted time never exceeds used time, and any window split in
two gives parts that add up to the whole; plus the arithmetic on worked examples (a
window shorter than an hour, a reservation's last pass, time-slice holders, MIG)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.domain.booked_hours import UsageSpan
from coordinator.domain.gpu_use_accrual import HOUR_MS, UNBOOKED, AccrualKey, Accrued, accrue
from coordinator.domain.gpu_use_report import UseHour, reservation_use
from coordinator.domain.gpu_use_units import Hold
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
        UseHour(k.hour, k.reservation_id, k.tenant_id, v.who.pool_id, v.who.project_id,
               k.resource, v.used_ms, v.weighted_ms, v.unknown_ms)
        for k, v in total.items()
    ]  # fmt: skip


def _add(total: dict[AccrualKey, Accrued], more: dict[AccrualKey, Accrued]) -> None:
    for k, v in more.items():
        acc = total.setdefault(k, Accrued(v.who))
        acc.used_ms += v.used_ms
        acc.weighted_ms += v.weighted_ms
        acc.unknown_ms += v.unknown_ms


def _uses(busy: set[str], util: int | None, owner: int = -1) -> dict[str, dict[str, DeviceUse]]:
    """Units in `busy` run one process: of reservation `rsv-<owner>`, or nobody's (< 0)."""
    proc = (
        ProcessUse(pid=1, owner=f"rsv-{owner}", owner_kind="reservation")
        if owner >= 0
        else ProcessUse(pid=1)
    )
    return {
        NODE: {
            u: DeviceUse(device_id=u, sm_util=util, processes=(proc,) if u in busy else ())
            for u in UNITS
        }
    }


def _during(holds: list[Hold], a: int, b: int) -> list[Hold]:
    """The bookings a pass over [a, b) reads: every one live at some time in it."""
    return [h for h in holds if h.start <= b and h.end > a]


holds_st = st.lists(
    st.tuples(
        st.sampled_from(("gpu", "gpu.slot", "node")),
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
        uses = _uses(busy, util, util % 5 - 1)  # slot holders by their processes, or nobody's
        _add(total, accrue(uses, _during(holds, a, now), {NODE: POOL}, {NODE: (a, now)}))
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


@settings(max_examples=300, deadline=None)
@given(
    holds_st, passes_st, st.integers(0, 4 * HOUR_MS), st.integers(2, 4 * HOUR_MS),
    st.floats(0.0, 1.0), st.booleans(),
)  # fmt: skip
def test_a_window_split_in_two_adds_up_to_the_whole(
    raw: list[tuple[str, str, int, int]],
    passes: list[tuple[int, set[str], int]],
    w_start: int,
    w_len: int,
    cut: float,
    known: bool,
) -> None:
    holds = [
        _hold(f"rsv-{i}", cls, UNITS if cls == "node" else (unit,), start, start + length)
        for i, (cls, unit, start, length) in enumerate(raw)
    ]
    now = 0
    total: dict[AccrualKey, Accrued] = {}
    for gap, busy, util in passes:
        a, now = now, now + gap
        uses = _uses(busy, util if known else None, util % 5 - 1)
        _add(total, accrue(uses, _during(holds, a, now), {NODE: POOL}, {NODE: (a, now)}))
    spans = [_span(h) for h in holds]
    start, end = w_start, w_start + w_len
    mid = start + 1 + int(cut * (w_len - 2))

    def report(a: int, b: int) -> tuple[dict[str, tuple[int, int | None]], dict[str, int]]:
        rows, free = reservation_use(spans, _buckets(total), a, b, now)
        return (
            {r.reservation_id: (r.used_ms, r.weighted_ms) for r in rows},
            {f.pool_id: f.used_ms for f in free},
        )

    whole, whole_free = report(start, end)
    first, first_free = report(start, mid)
    second, second_free = report(mid, end)
    for rid in whole.keys() | first.keys() | second.keys():
        u, w = whole.get(rid, (0, 0))
        u1, w1 = first.get(rid, (0, 0))
        u2, w2 = second.get(rid, (0, 0))
        assert abs(u1 + u2 - u) <= 2, rid  # each part rounds down once
        if known:
            assert w is not None and w1 is not None and w2 is not None
            assert abs(w1 + w2 - w) <= 2, rid
        else:
            assert w is None or u == 0
    for pool in whole_free.keys() | first_free.keys() | second_free.keys():
        parts = first_free.get(pool, 0) + second_free.get(pool, 0)
        assert abs(parts - whole_free.get(pool, 0)) <= 2


def test_a_reservation_s_use_is_its_own_up_to_its_end_and_counts_whole_in_a_short_window() -> None:
    """R1 = GPU-0 [t, t+60 s), R2 = GPU-0 [t+60 s, t+120 s), t half an hour into the hour;
    passes every 7 s, a process at 80 % seen at each from t+7 s to t+126 s, so used from
    t to t+126 s: R1 60 s (48 s weighted) — the pass at t+63 s credits its last 4 s to
    it —, R2 60 s, unbooked 6 s. A window of R1's own minute says all of it."""
    t = 10 * HOUR_MS + HOUR_MS // 2
    r1 = _hold("r1", "gpu", ("GPU-0",), t, t + 60_000)
    r2 = _hold("r2", "gpu", ("GPU-0",), t + 60_000, t + 120_000)
    total: dict[AccrualKey, Accrued] = {}
    for a in range(t, t + 126_000, 7_000):
        b = a + 7_000
        _add(total, accrue(_uses({"GPU-0"}, 80), _during([r1, r2], a, b), {NODE: POOL},
                           {NODE: (a, b)}))  # fmt: skip
    spans = [_span(r1), _span(r2)]
    rows, free = reservation_use(spans, _buckets(total), t, t + 60_000, t + 126_000)
    assert [(r.reservation_id, r.booked_ms, r.used_ms, r.weighted_ms) for r in rows] == [
        ("r1", 60_000, 60_000, 48_000)
    ]
    rows, free = reservation_use(spans, _buckets(total), t - HOUR_MS // 2, t + HOUR_MS // 2,
                                 t + 126_000)  # fmt: skip
    assert [(r.reservation_id, r.used_ms) for r in rows] == [("r1", 60_000), ("r2", 60_000)]
    assert [(f.used_ms, f.weighted_ms) for f in free] == [(6_000, 4_800)]


def _slot(rid: str) -> Hold:
    return _hold(rid, "gpu.slot", ("GPU-0",), 0, HOUR_MS)


def test_a_shared_gpu_is_credited_to_the_holders_whose_processes_ran() -> None:
    """Two slot holders of GPU-0 for a minute at 60 %: R0's process alone → R0 60 s
    (its own 30 % weights it), R1 nothing; both run → each 60 s at its own figure; a
    process nobody holding it owns beside R0's → R1, the holder with none, 60 s."""
    r0, r1 = _slot("r0"), _slot("r1")

    def credited(*procs: ProcessUse) -> dict[str, tuple[int, int]]:
        uses = {NODE: {"GPU-0": DeviceUse(device_id="GPU-0", sm_util=60, processes=procs)}}
        got = accrue(uses, [r0, r1], {NODE: POOL}, {NODE: (0, 60_000)})
        return {k.reservation_id: (v.used_ms, v.weighted_ms) for k, v in got.items()}

    def mine(rid: str, pid: int, util: int) -> ProcessUse:
        return ProcessUse(pid=pid, owner=rid, owner_kind="reservation", sm_util=util)

    assert credited(mine("r0", 1, 30)) == {"r0": (60_000, 18_000)}
    assert credited(mine("r0", 1, 30), mine("r1", 2, 20)) == {
        "r0": (60_000, 18_000), "r1": (60_000, 12_000),
    }  # fmt: skip
    stray = ProcessUse(pid=3, owner="pod-1", owner_kind="pod", sm_util=10)
    assert credited(mine("r0", 1, 30), stray) == {"r0": (60_000, 18_000), "r1": (60_000, 6_000)}
    # Nobody's process on a GPU both hold: split between them.
    assert credited(stray) == {"r0": (30_000, 3_000), "r1": (30_000, 3_000)}


def test_use_with_no_utilization_figure_has_no_weighted_time() -> None:
    """A MIG instance (NVML has no figure for it) busy for a minute: used 60 s, weighted
    None in the report, never 0; unbooked use alike."""
    mig = _hold("rm", "gpu.mig", ("MIG-0",), 0, HOUR_MS)
    uses = {
        NODE: {
            u: DeviceUse(device_id=u, processes=(ProcessUse(pid=1),)) for u in ("MIG-0", "MIG-1")
        }
    }
    total = accrue(uses, [mig], {NODE: POOL}, {NODE: (0, 60_000)})
    rows, free = reservation_use([_span(mig)], _buckets(total), 0, HOUR_MS, 60_000)
    assert [(r.used_ms, r.weighted_ms) for r in rows] == [(60_000, None)]
    assert [(f.used_ms, f.weighted_ms) for f in free] == [(60_000, None)]
