"""Use is a condition, not an event (issue 34), on a real ledger (SQLite and
PostgreSQL), passes driven by hand: `gpu.unbookedUse` is said once while it lasts and
ended once when it stops, the ledger keeps what is open, and a replica that starts
leading (another watch on the same ledger, in a new term) goes on from there: it says
nothing again and still ends what the old leader said."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from coordinator.domain.gpu_use_accrual import HOUR_MS
from coordinator.ledger import Ledger
from coordinator.services.gpu_use_watch import GpuUseWatch
from shared.clock import FakeClock
from shared.subjects import Subjects
from shared.wire import DeviceUse, ProcessUse, UseReport
from tests.factories import make_inventory
from tests.fakes import RecordingAlerts, RecordingPublisher

T0 = 1000 * HOUR_MS
BUSY = DeviceUse(
    device_id="GPU-n1-0", sm_util=60,
    processes=(ProcessUse(pid=7, owner="ml/train-0", owner_kind="pod"),),
)  # fmt: skip
QUIET = DeviceUse(device_id="GPU-n1-0", sm_util=0)


@pytest.fixture
async def ledger(database_url: str) -> AsyncIterator[Ledger]:
    ledger = await Ledger.open(database_url)
    try:
        yield ledger
    finally:
        await ledger.close()


def _watch(ledger: Ledger, clock: FakeClock, alerts: RecordingAlerts, term: int) -> GpuUseWatch:
    watch = GpuUseWatch(
        ledger, Subjects("t"), clock, RecordingPublisher(), alerts, reachable=lambda _: True,
        flush_ms=0, term=lambda: term,
    )  # fmt: skip
    watch.on_inventory(make_inventory("n1", "p1", gpus=1))
    return watch


def _report(watch: GpuUseWatch, version: int, use: DeviceUse) -> None:
    watch.on_report(
        UseReport(
            node_id="n1", pool_id="p1", boot_id="b", sent_at=0, use_version=version,
            devices=(use,),
        )
    )  # fmt: skip


async def test_unbooked_use_fires_while_true_and_resolves_once_when_gone(ledger: Ledger) -> None:
    clock = FakeClock(T0)
    alerts = RecordingAlerts()
    watch = _watch(ledger, clock, alerts, term=1)
    for version in range(1, 5):
        _report(watch, version, BUSY)
        await watch.tick()
        clock.advance(5000)
    assert alerts.kinds() == ["gpu.unbookedUse"]
    (open_,) = await ledger.gpu_use.conditions()
    assert (open_.kind, open_.node_id, open_.device_id) == ("gpu.unbookedUse", "n1", "GPU-n1-0")
    _report(watch, 5, QUIET)
    await watch.tick()
    clock.advance(5000)
    await watch.tick()
    assert alerts.kinds() == ["gpu.unbookedUse", "gpu.unbookedUseEnded"]
    (ended,) = alerts.alerts[1:]
    assert (ended.node_id, ended.pool_id, ended.device_id) == ("n1", "p1", "GPU-n1-0")
    assert await ledger.gpu_use.conditions() == []
    events = [e.kind for e in await ledger.catalog.events("n1")]
    assert events == ["gpu.unbookedUse", "gpu.unbookedUseEnded"]


async def test_a_new_leader_neither_says_again_nor_misses_the_end(ledger: Ledger) -> None:
    clock = FakeClock(T0)
    old_alerts, new_alerts = RecordingAlerts(), RecordingAlerts()
    old = _watch(ledger, clock, old_alerts, term=1)
    _report(old, 1, BUSY)
    await old.tick()
    assert old_alerts.kinds() == ["gpu.unbookedUse"]
    # The old leader goes; another replica, whose book heard the same use, leads.
    new = _watch(ledger, clock, new_alerts, term=2)
    for version in (1, 2):
        clock.advance(5000)
        _report(new, version, BUSY)
        await new.tick()
    assert new_alerts.kinds() == []
    assert new.unbooked == {("n1", "GPU-n1-0")}
    clock.advance(5000)
    _report(new, 3, QUIET)
    await new.tick()
    assert new_alerts.kinds() == ["gpu.unbookedUseEnded"]
    assert await ledger.gpu_use.conditions() == []
    # The old replica leads again (a third term): it takes the ledger's word, not its
    # memory of the first term, and says nothing of what is over.
    old.term = lambda: 3
    clock.advance(5000)
    _report(old, 4, QUIET)
    await old.tick()
    assert old_alerts.kinds() == ["gpu.unbookedUse"]
