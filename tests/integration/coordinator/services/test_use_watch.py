"""The use pass on a real ledger (SQLite and PostgreSQL), driven by hand with a fake
clock: a pass's alerts and node events are written at once, accrued time only every
`flush_ms` (then all of it), and a gap longer than `max_gap_ms` credits nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from coordinator.domain.gpu_use_accrual import HOUR_MS
from coordinator.ledger import Ledger
from coordinator.services.gpu_use_watch import GpuUseWatch
from shared.clock import FakeClock
from shared.subjects import Subjects
from shared.wire import DeviceUse, OwnerMemory, ProcessUse, UseReport
from tests.factories import make_inventory
from tests.fakes import RecordingAlerts, RecordingPublisher

T0 = 1000 * HOUR_MS


@pytest.fixture
async def ledger(database_url: str) -> AsyncIterator[Ledger]:
    ledger = await Ledger.open(database_url)
    try:
        yield ledger
    finally:
        await ledger.close()


async def test_alerts_go_at_once_and_accrued_time_every_flush(ledger: Ledger) -> None:
    clock = FakeClock(T0)
    alerts = RecordingAlerts()
    watch = GpuUseWatch(
        ledger, Subjects("t"), clock, RecordingPublisher(), alerts, reachable=lambda _: True,
        max_gap_ms=60_000, flush_ms=60_000,
    )  # fmt: skip
    watch.on_inventory(make_inventory("n1", "p1", gpus=1))
    busy = DeviceUse(device_id="GPU-n1-0", sm_util=50, processes=(ProcessUse(pid=1),))
    watch.on_report(
        UseReport(
            node_id="n1", pool_id="p1", boot_id="b", sent_at=0, use_version=1, devices=(busy,)
        )
    )

    async def used_ms() -> int:
        return sum(b.used_ms for b in await ledger.gpu_use.buckets(T0, T0 + HOUR_MS))

    await watch.tick()  # the first pass: said, nothing accrued yet
    assert alerts.kinds() == ["gpu.unbookedUse"]
    assert [e.kind for e in await ledger.catalog.events("n1")] == ["gpu.unbookedUse"]
    for _ in range(5):
        clock.advance(10_000)
        watch.on_report(
            UseReport(
                node_id="n1", pool_id="p1", boot_id="b", sent_at=0, use_version=1, devices=(busy,)
            )
        )
        await watch.tick()
    assert await used_ms() == 0  # 50 s accrued, held in memory
    clock.advance(10_000)
    await watch.tick()
    assert await used_ms() == 60_000
    (bucket,) = await ledger.gpu_use.buckets(T0, T0 + HOUR_MS)
    assert (bucket.reservation_id, bucket.pool_id, bucket.weighted_ms) == ("", "p1", 30_000)
    # Silent past the gap (the report kept fresh meanwhile): the gap credits nothing.
    clock.advance(120_000)
    watch.on_report(
        UseReport(
            node_id="n1", pool_id="p1", boot_id="b", sent_at=0, use_version=2, devices=(busy,)
        )
    )
    await watch.tick()
    clock.advance(60_000)
    await watch.tick()
    assert await used_ms() == 120_000
    assert alerts.kinds() == ["gpu.unbookedUse"]


async def test_memory_held_is_written_with_the_accrued_time(ledger: Ledger) -> None:
    """Chargeback (issue 35): an owner's host memory becomes MiB-ms of its quarter at the
    flush; one that names no live reservation is unattributed, not dropped. A GPU
    process's own GPU memory is not host memory: not charged."""
    clock = FakeClock(T0)
    watch = GpuUseWatch(
        ledger, Subjects("t"), clock, RecordingPublisher(), RecordingAlerts(),
        reachable=lambda _: True, max_gap_ms=60_000, flush_ms=60_000,
    )  # fmt: skip
    watch.on_inventory(make_inventory("n1", "p1", gpus=1))
    proc = ProcessUse(pid=1, used_memory_mib=2048, owner="rsv_gone", owner_kind="reservation")
    busy = DeviceUse(device_id="GPU-n1-0", sm_util=50, processes=(proc,))
    held_by = OwnerMemory(owner_kind="reservation", owner="rsv_gone", current_mib=2048)
    for i in range(7):
        watch.on_report(
            UseReport(
                node_id="n1", pool_id="p1", boot_id="b", sent_at=0, use_version=1,
                devices=(busy,), memory=(held_by,),
            )
        )  # fmt: skip
        await watch.tick()
        if i < 6:
            clock.advance(10_000)
    held = await ledger.memory_use.used(T0, T0 + HOUR_MS)
    assert {(k.tenant_id, k.pool_id, v.mib_ms, v.peak_mib) for k, v in held.items()} == {
        ("", "p1", 2048 * 60_000, 2048)
    }


async def test_a_pass_whose_write_failed_is_counted_once(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed write leaves the pass uncommitted and its time is covered again by the
    next one, so what is held in memory must not have it already. Two nodes in two
    pools report the same use on one clock; the first flush of n1 fails once: in the
    end both pools hold the same used time."""
    clock = FakeClock(T0)

    def watch_of(node: str, pool: str) -> GpuUseWatch:
        watch = GpuUseWatch(
            ledger, Subjects("t"), clock, RecordingPublisher(), RecordingAlerts(),
            reachable=lambda _: True, max_gap_ms=60_000, flush_ms=30_000,
        )  # fmt: skip
        watch.on_inventory(make_inventory(node, pool, gpus=1))
        return watch

    def report(node: str, pool: str) -> UseReport:
        busy = DeviceUse(device_id=f"GPU-{node}-0", sm_util=50, processes=(ProcessUse(pid=1),))
        return UseReport(
            node_id=node, pool_id=pool, boot_id="b", sent_at=0, use_version=1, devices=(busy,)
        )

    record = ledger.gpu_use.record
    failing = {"once": True}

    async def flaky(*args: object, **kwargs: object) -> None:
        if args[0] and failing.pop("once", False):
            raise ConnectionError("the database went away")
        await record(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ledger.gpu_use, "record", flaky)
    watches = {("n1", "p1"): watch_of("n1", "p1"), ("n2", "p2"): watch_of("n2", "p2")}
    failed = 0
    for _ in range(13):  # 0 to 120 s, 10 s a pass; n1's first flush fails
        for (node, pool), watch in watches.items():
            watch.on_report(report(node, pool))
            try:
                await watch.tick()
            except ConnectionError:
                failed += 1
        clock.advance(10_000)
    for (node, pool), watch in watches.items():  # a last pass, written whatever is held
        watch.flush_ms = 0
        watch.on_report(report(node, pool))
        await watch.tick()
    used = {"p1": 0, "p2": 0}
    for b in await ledger.gpu_use.buckets(T0, T0 + HOUR_MS):
        used[b.pool_id] += b.used_ms
    assert failed == 1 and used["p2"] > 0
    assert used["p1"] == used["p2"]
