"""The coordinator's book of use (SPEC §10): deltas apply only on the version held, a
full report replaces everything, and a heartbeat without use changes nothing."""

from __future__ import annotations

from coordinator.domain.gpu_use_book import Applied, GpuUseBook
from shared.wire import DeviceUse, Heartbeat, NodeHealth, ProcessUse, UseReport


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


def test_deltas_apply_on_the_version_held_and_anything_else_asks_for_a_report() -> None:
    book = GpuUseBook()
    assert book.on_heartbeat(_hb(0, 0), 0) is Applied.NONE  # an agent without use
    assert book.on_heartbeat(_hb(0, 1, BUSY), 0) is Applied.NEEDS_REPORT  # nothing held
    book.on_report(_report(3, IDLE, OTHER), 10)
    assert book.nodes["n1"].devices == {"GPU-0": IDLE, "GPU-1": OTHER}
    assert book.on_heartbeat(_hb(2, 4, BUSY), 20) is Applied.NEEDS_REPORT  # not our base
    assert book.on_heartbeat(_hb(3, 4, BUSY), 30) is Applied.APPLIED
    assert book.nodes["n1"].devices == {"GPU-0": BUSY, "GPU-1": OTHER}
    assert book.on_heartbeat(_hb(3, 4, BUSY), 40) is Applied.NONE  # the version we hold
    assert book.nodes["n1"].updated_at == 40
    assert book.on_heartbeat(_hb(4, 5, IDLE, boot="b2"), 50) is Applied.NEEDS_REPORT
    # A report older than the deltas applied since is no news.
    book.on_report(_report(3, OTHER), 60)
    assert book.nodes["n1"].version == 4 and "GPU-0" in book.nodes["n1"].devices
    book.on_report(_report(1, OTHER, boot="b2"), 70)
    assert book.nodes["n1"].devices == {"GPU-1": OTHER}
