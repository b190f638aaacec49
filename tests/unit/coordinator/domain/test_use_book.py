"""The coordinator's book of use (SPEC §10): deltas apply only on the version held, a
full report replaces everything, and a heartbeat without use changes nothing."""

from __future__ import annotations

from coordinator.domain.gpu_use_book import Applied, GpuUseBook, inventory_units
from shared.wire import DeviceUse, Heartbeat, NodeHealth, ProcessUse, UseReport
from tests.factories import make_inventory


def _hb(base: int, version: int, *use: DeviceUse, boot: str = "b1") -> Heartbeat:
    return Heartbeat(
        node_id="n1", pool_id="p1", boot_id=boot, seq=1, sent_at=0, interval_ms=5000,
        inventory_hash="h", health=NodeHealth(status="healthy"), use=use, use_base=base,
        use_version=version,
    )  # fmt: skip


def _report(version: int, *devices: DeviceUse, boot: str = "b1") -> UseReport:
    return UseReport(
        node_id="n1", pool_id="p1", boot_id=boot, sent_at=0, use_version=version, devices=devices
    )


BUSY = DeviceUse(device_id="GPU-0", sm_util=90, processes=(ProcessUse(pid=1),))
IDLE = DeviceUse(device_id="GPU-0", sm_util=0)
OTHER = DeviceUse(device_id="GPU-1", sm_util=0)


def _book() -> GpuUseBook:
    book = GpuUseBook()
    book.set_units("n1", frozenset({"GPU-0", "GPU-1"}))
    return book


def test_deltas_apply_on_the_version_held_and_anything_else_asks_for_a_report() -> None:
    book = _book()
    assert book.on_heartbeat(_hb(0, 0), 0) == (Applied.NONE, 0)  # an agent without use
    assert book.on_heartbeat(_hb(0, 1, BUSY), 0) == (Applied.NEEDS_REPORT, 0)  # nothing held
    book.on_report(_report(3, IDLE, OTHER), 10)
    assert book.nodes["n1"].devices == {"GPU-0": IDLE, "GPU-1": OTHER}
    assert book.on_heartbeat(_hb(2, 4, BUSY), 20) == (Applied.NEEDS_REPORT, 0)  # not our base
    assert book.on_heartbeat(_hb(3, 4, BUSY), 30) == (Applied.APPLIED, 0)
    assert book.nodes["n1"].devices == {"GPU-0": BUSY, "GPU-1": OTHER}
    assert book.on_heartbeat(_hb(3, 4, BUSY), 40) == (Applied.NONE, 0)  # the version we hold
    assert book.nodes["n1"].updated_at == 40
    assert book.on_heartbeat(_hb(4, 5, IDLE, boot="b2"), 50) == (Applied.NEEDS_REPORT, 0)
    # A report older than the deltas applied since is no news.
    book.on_report(_report(3, OTHER), 60)
    assert book.nodes["n1"].version == 4 and "GPU-0" in book.nodes["n1"].devices
    book.on_report(_report(1, OTHER, boot="b2"), 70)
    assert book.nodes["n1"].devices == {"GPU-1": OTHER}


def _fake(i: int) -> DeviceUse:
    return DeviceUse(device_id=f"GPU-fake-{i}", sm_util=90, processes=(ProcessUse(pid=i),))


def test_only_the_units_of_the_node_s_inventory_are_kept_the_others_counted() -> None:
    book = _book()
    assert book.on_report(_report(1, IDLE, *(_fake(i) for i in range(40))), 0) == 40
    assert set(book.nodes["n1"].devices) == {"GPU-0"}
    assert book.on_heartbeat(_hb(1, 2, BUSY, _fake(1), _fake(2)), 10) == (Applied.APPLIED, 2)
    assert set(book.nodes["n1"].devices) == {"GPU-0"} and book.unknown_devices == 42
    # A node with no inventory recorded has no units: none of its use is kept.
    stranger = UseReport(
        node_id="n2", pool_id="p1", boot_id="b", sent_at=0, use_version=1, devices=(BUSY,)
    )
    assert book.on_report(stranger, 0) == 1 and book.nodes["n2"].devices == {}
    # The inventory changes: the use of a unit it no longer has goes with it.
    assert book.set_units("n1", frozenset({"GPU-1"})) is True
    assert book.nodes["n1"].devices == {} and not book.set_units("n1", frozenset({"GPU-1"}))


def test_an_inventory_s_units_are_its_gpus_and_mig_instances() -> None:
    inv = make_inventory("n1", "p1", gpus=2, mig=2)
    units = inventory_units(inv)
    assert {g.uuid for g in inv.gpus} <= units
    migs = {m.uuid for g in inv.gpus for m in g.mig_instances}
    assert migs and migs <= units
    assert units == {g.uuid for g in inv.gpus} | migs
