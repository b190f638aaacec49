"""Use attributed exactly (SPEC §10, issue 31), on SQLite and PostgreSQL: the use pass
driven by hand with the test's clock over bookings made through the API, and
`usage.report` read over HTTP. Every expected figure is worked out by hand in the test.

The pass samples each unit at its end and credits what it saw to the time since the
last pass: with a pass every 5 s, a process seen from the pass at t+10 s on is
credited from t+5 s."""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import pytest

from coordinator.app import Coordinator
from coordinator.services.gpu_use_watch import GpuUseWatch
from coordinator.services.node_records import record_inventory
from shared.clock import FakeClock
from shared.subjects import Subjects
from shared.wire import Atom, DeviceUse, ProcessUse, UseReport
from tests.factories import backed, make_inventory
from tests.fakes import RecordingAlerts, RecordingPublisher
from tests.integration.conftest import Api

S = 1000
MIN = 60 * S
H = 60 * MIN


async def _watch(c: Coordinator, clock: FakeClock) -> GpuUseWatch:
    watch = GpuUseWatch(
        c.ledger, Subjects("t"), clock, RecordingPublisher(), RecordingAlerts(),
        reachable=lambda _: True, flush_ms=0,
    )  # fmt: skip
    await watch.load()  # the units of the inventories recorded
    return watch


async def _run(
    watch: GpuUseWatch,
    clock: FakeClock,
    node: str,
    pool: str,
    until: int,
    devices: Callable[[int], tuple[DeviceUse, ...]],
    step: int = 5 * S,
) -> None:
    """Passes every `step` from now to `until`, each after a full report of `devices(now)`."""
    version = 0
    while True:
        version += 1
        now = clock.now_ms()
        watch.on_report(
            UseReport(
                node_id=node, pool_id=pool, boot_id="boot-1", sent_at=0, use_version=version,
                devices=devices(now),
            )
        )  # fmt: skip
        await watch.tick()
        if now >= until:
            return
        clock.advance(step)


async def _tenant_pool(api: Api, name: str) -> str:
    await api.ok("tenants.create", {"tenantId": "acme"})
    return str((await api.ok("pools.create", {"tenantId": "acme", "name": name}))["poolId"])


def _book(pool: str, key: str, cls: str, count: int, start: int, seconds: int) -> dict[str, object]:
    return {
        "tenantId": "acme", "poolId": pool, "devices": [{"class": cls, "count": count}],
        "start": start, "duration": seconds, "idempotencyKey": key,
    }  # fmt: skip


async def _by_reservation(api: Api, start: int, end: int, **kw: object) -> dict[str, dict]:  # type: ignore[type-arg]
    report = await api.ok("usage.report", {"from": start, "to": end, "byReservation": True} | kw)
    return {r["reservationId"]: r for r in report["byReservation"]} | {
        "": {"unbooked": report["unbooked"], "rows": report["rows"]}
    }


async def test_a_window_shorter_than_an_hour_counts_each_reservation_in_full(
    capi: Api, clocked: Coordinator, clock: FakeClock
) -> None:
    """R1 = 8 GPUs [t, t+60 s), R2 = 8 GPUs [t+60 s, t+120 s), half an hour into the
    hour; one process at 80 % on GPU 0, credited from t+5 s to t+125 s. R1 used 55 s
    (44 s weighted), its last 5 s included; R2 60 s (48 s); the 5 s after R2 unbooked.
    Any window holding a reservation's whole booking says the same."""
    pool = await _tenant_pool(capi, "cut")
    await record_inventory(clocked.ledger, make_inventory("n0", pool, gpus=8), 1)
    clock.advance(30 * MIN)
    t = clock.now_ms()
    r1 = (await capi.ok("reservations.create", _book(pool, "r1", "gpu", 8, t, 60)))["reservationId"]
    r2 = (await capi.ok("reservations.create", _book(pool, "r2", "gpu", 8, t + MIN, 60)))[
        "reservationId"
    ]
    busy = (DeviceUse(device_id="GPU-n0-0", sm_util=80, processes=(ProcessUse(pid=7),)),)
    idle = (DeviceUse(device_id="GPU-n0-0"),)
    watch = await _watch(clocked, clock)
    await _run(watch, clock, "n0", pool, t + 130 * S,
               lambda now: busy if t + 10 * S <= now <= t + 125 * S else idle)  # fmt: skip

    both = await _by_reservation(capi, t, t + 2 * MIN)
    assert both[r1]["hours"] == pytest.approx(8 * 60 / 3600, abs=1e-6)
    assert (both[r1]["usedHours"], both[r1]["weightedHours"]) == pytest.approx(
        (55 / 3600, 44 / 3600), abs=1e-6
    )
    assert (both[r2]["usedHours"], both[r2]["weightedHours"]) == pytest.approx(
        (60 / 3600, 48 / 3600), abs=1e-6
    )
    own = await _by_reservation(capi, t, t + MIN)
    assert (own[r1]["usedHours"], own[r1]["weightedHours"]) == pytest.approx(
        (55 / 3600, 44 / 3600), abs=1e-6
    )
    assert r2 not in own
    hour = await _by_reservation(capi, t - 30 * MIN, t + 30 * MIN)
    assert hour[r1]["usedHours"] == both[r1]["usedHours"]
    assert [(u["usedHours"], u["weightedHours"]) for u in hour[""]["unbooked"]] == [
        pytest.approx((5 / 3600, 4 / 3600), abs=1e-6)
    ]


def _sliced(node: str, pool: str) -> object:
    inv = make_inventory(node, pool, gpus=1)
    gpu = next(a for a in inv.atoms if a.cls == "gpu")
    slots = [
        Atom(atom_id=f"{node}:gpu.slot:{gpu.device_id}:{j}", cls="gpu.slot",
             device_id=gpu.device_id)
        for j in range(2)
    ]  # fmt: skip
    return backed(
        msgspec.structs.replace(
            inv, atoms=(*(a for a in inv.atoms if a != gpu), *slots),
            inventory_hash=inv.inventory_hash + "-sliced",
        )
    )  # fmt: skip


async def test_a_time_sliced_gpu_is_credited_to_the_holder_whose_process_ran(
    capi: Api, clocked: Coordinator, clock: FakeClock
) -> None:
    """R0 and R1 each book one of GPU 0's two slots; a process of R0 at 50 % runs 60 s:
    R0 used 60 s (30 s weighted), R1, with no process, nothing."""
    pool = await _tenant_pool(capi, "slices")
    inv = _sliced("s0", pool)
    await record_inventory(clocked.ledger, inv, 1)  # type: ignore[arg-type]
    t = clock.now_ms()
    r0 = (await capi.ok("reservations.create", _book(pool, "s0", "gpu.slot", 1, t, 3600)))[
        "reservationId"
    ]
    r1 = (await capi.ok("reservations.create", _book(pool, "s1", "gpu.slot", 1, t, 3600)))[
        "reservationId"
    ]
    mine = ProcessUse(pid=9, owner=r0, owner_kind="reservation", sm_util=50)
    busy = (DeviceUse(device_id="GPU-s0-0", sm_util=50, processes=(mine,)),)
    idle = (DeviceUse(device_id="GPU-s0-0"),)
    watch = await _watch(clocked, clock)
    await _run(watch, clock, "s0", pool, t + 90 * S,
               lambda now: busy if t + 5 * S <= now <= t + 60 * S else idle)  # fmt: skip

    got = await _by_reservation(capi, t, t + H)
    assert (got[r0]["usedHours"], got[r0]["weightedHours"]) == pytest.approx(
        (60 / 3600, 30 / 3600), abs=1e-6
    )
    assert (got[r1]["usedHours"], got[r1]["weightedHours"], got[r1]["efficiency"]) == (0, 0, 0)


async def test_a_mig_instance_without_a_utilization_figure_has_no_weighted_hours(
    capi: Api, clocked: Coordinator, clock: FakeClock
) -> None:
    """A MIG booking whose process NVML gives no utilization for, 60 s: 60 s used, and
    weighted hours null (not 0) in its row, its reservation's row and the totals."""
    pool = await _tenant_pool(capi, "mig")
    await record_inventory(clocked.ledger, make_inventory("k0", pool, gpus=0, mig=2), 1)
    t = clock.now_ms()
    rid = (await capi.ok("reservations.create", _book(pool, "m", "gpu.mig", 1, t, 3600)))[
        "reservationId"
    ]
    # Both instances busy: whichever it holds, the other's use is unbooked.
    busy = tuple(
        DeviceUse(device_id=f"MIG-k0-{i}", processes=(ProcessUse(pid=3 + i),)) for i in (0, 1)
    )
    watch = await _watch(clocked, clock)
    await _run(watch, clock, "k0", pool, t + 60 * S, lambda now: busy if now > t else ())

    got = await _by_reservation(capi, t, t + H)
    assert got[rid]["usedHours"] == pytest.approx(60 / 3600, abs=1e-6)
    assert got[rid]["weightedHours"] is None
    (row,) = [r for r in got[""]["rows"] if r["resource"] == "gpu.mig"]
    # A report row leaves out what it cannot say.
    assert (row["usedHours"], row.get("weightedHours")) == (
        pytest.approx(60 / 3600, abs=1e-6),
        None,
    )
    report = await capi.ok("usage.report", {"from": t, "to": t + H})
    assert report["weightedTotals"]["gpu.mig"] is None
