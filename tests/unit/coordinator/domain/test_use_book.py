"""The coordinator's book of use (SPEC §10): deltas apply only on the version held, a
full report replaces everything, a heartbeat without use changes nothing, and owners'
host memory is kept per owner, each peak counted at one pass."""

from __future__ import annotations

import msgspec

from coordinator.domain.gpu_use_book import Applied, GpuUseBook, atom_units, inventory_units
from shared.wire import (
    MAX_OWNER_MEMORY,
    DeviceUse,
    Heartbeat,
    NodeHealth,
    OwnerMemory,
    ProcessUse,
    UseReport,
)
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


def test_a_forgotten_node_s_use_and_units_go_and_the_book_lists_the_others() -> None:
    book = _book()
    book.set_units("n2", frozenset({"GPU-9"}))
    book.on_report(_report(1, IDLE), 0)
    book.on_report(UseReport(node_id="n2", pool_id="p1", boot_id="b", sent_at=0, use_version=1), 0)
    assert [u.node_id for u in book] == ["n1", "n2"]
    book.forget("n1")
    book.forget("n3")  # never known: nothing to do
    assert [u.node_id for u in book] == ["n2"] and "n1" not in book.units
    # Back with no inventory recorded: none of its use is kept.
    assert book.on_report(_report(2, IDLE), 10) == 1 and book.nodes["n1"].devices == {}


def test_a_node_s_recorded_atoms_stand_for_its_gpus_and_mig_instances() -> None:
    """Read back from the ledger, whatever the order: a GPU atom stands for its GPU; a
    MIG atom for its GPU (whose memory the agent reports) and its instance, by the
    instance's `uuid`, else its atom id's last part; other atoms for nothing."""
    rows = [
        ("node", "n1:node", "", {}),
        ("nic.vf", "n1:nic.vf:0", "nic0", {}),
        ("gpu", "n1:gpu:0", "GPU-0", {}),
        ("gpu.mig", "n1:gpu.mig:MIG-a", "GPU-1", {"uuid": "MIG-x"}),
        ("gpu.mig", "n1:gpu.mig:MIG-b", "GPU-1", {}),
        ("gpu.mig", "n1:gpu.mig:MIG-c", "GPU-1", {"uuid": ""}),
    ]
    assert atom_units(rows) == {"GPU-0", "GPU-1", "MIG-x", "MIG-b", "MIG-c"}


def test_an_inventory_s_gpus_count_even_where_its_atoms_do_not_name_them() -> None:
    inv = make_inventory("n1", "p1", gpus=2, mig=2)
    bare = msgspec.structs.replace(inv, atoms=[a for a in inv.atoms if a.cls == "node"])
    assert inventory_units(bare) == inventory_units(inv)


def test_the_book_keeps_each_node_s_pool_and_freshness_and_counts_what_it_applied() -> None:
    book = _book()
    assert book.on_report(_report(3, IDLE), 10) == 0
    held = book.nodes["n1"]
    assert (held.node_id, held.pool_id, held.boot_id, held.version, held.updated_at) == (
        "n1", "p1", "b1", 3, 10,
    )  # fmt: skip
    moved = msgspec.structs.replace(_hb(3, 4, BUSY), pool_id="p2")
    assert book.on_heartbeat(moved, 20) == (Applied.APPLIED, 0)
    assert (held.pool_id, held.version, held.updated_at) == ("p2", 4, 20)
    book.on_heartbeat(_hb(3, 5, IDLE), 30)  # not our base
    book.on_heartbeat(_hb(2, 5, IDLE), 35)
    book.on_heartbeat(_hb(4, 5, IDLE), 40)
    assert (book.reports, book.deltas, book.mismatches) == (1, 2, 2)
    # A report older than the deltas applied changes nothing and drops nothing.
    assert book.on_report(_report(4, _fake(1)), 50) == 0 and book.reports == 1
    # The answer to a request for a report, at the version held, is applied.
    book.on_report(_report(5, OTHER), 60)
    assert book.nodes["n1"].devices == {"GPU-1": OTHER} and book.reports == 2


def _mem(owner: str, current: int, peak: int = 0) -> OwnerMemory:
    return OwnerMemory(owner_kind="slurm", owner=owner, current_mib=current, peak_mib=peak)


def _taken(book: GpuUseBook) -> dict[str, tuple[int, int]]:
    return {m.owner: (m.current_mib, m.peak_mib) for m in book.nodes["n1"].take_memory()}


def test_owners_memory_is_kept_per_owner_and_each_peak_counts_at_one_pass() -> None:
    """Issue 35: a report and the deltas after it keep each owner's host memory; an
    entry of 0 MiB says the owner is gone; a pass takes each owner's memory now with
    the most it held since the last pass, and the next pass sees that peak no more."""
    book = _book()
    book.on_report(msgspec.structs.replace(_report(1), memory=(_mem("7", 100, 300),)), 0)
    delta = (_mem("7", 50, 120), _mem("8", 10, 10))
    book.on_heartbeat(msgspec.structs.replace(_hb(1, 2), memory=delta), 10)
    assert _taken(book) == {"7": (50, 300), "8": (10, 10)}
    assert _taken(book) == {"7": (50, 50), "8": (10, 10)}  # the peak was counted
    gone = (_mem("8", 0, 0), _mem("9", 0, 0))  # "9" was never held: nothing to drop
    book.on_heartbeat(msgspec.structs.replace(_hb(2, 3), memory=gone), 20)
    assert _taken(book) == {"7": (50, 50)}
    # An owner whose memory fell to 0 but peaked since the last pass still counts.
    book.on_heartbeat(msgspec.structs.replace(_hb(3, 4), memory=(_mem("7", 0, 80),)), 30)
    assert _taken(book) == {"7": (0, 80)}


def test_a_report_of_the_same_boot_keeps_the_peaks_no_pass_took_yet() -> None:
    book = _book()
    book.on_report(msgspec.structs.replace(_report(1), memory=(_mem("7", 10, 500),)), 0)
    book.on_report(msgspec.structs.replace(_report(2), memory=(_mem("7", 10, 20),)), 10)
    assert _taken(book) == {"7": (10, 500)}
    book.on_report(msgspec.structs.replace(_report(3), memory=(_mem("7", 10, 600),)), 20)
    # A new boot: what the old one held is not this boot's use.
    rebooted = msgspec.structs.replace(_report(1, boot="b2"), memory=(_mem("7", 10, 20),))
    book.on_report(rebooted, 30)
    assert _taken(book) == {"7": (10, 20)}


def test_a_node_holds_no_more_owners_than_the_wire_allows() -> None:
    """A sender past `MAX_OWNER_MEMORY` owners gets no more kept; the owners held are
    still updated, and an owner gone frees its place."""
    book = _book()
    full = tuple(_mem(str(i), 1) for i in range(MAX_OWNER_MEMORY))
    book.on_report(msgspec.structs.replace(_report(1), memory=full), 0)
    more = (_mem("new", 5), _mem("0", 7))
    book.on_heartbeat(msgspec.structs.replace(_hb(1, 2), memory=more), 10)
    held = _taken(book)
    assert len(held) == MAX_OWNER_MEMORY and "new" not in held and held["0"] == (7, 7)
    swap = (_mem("1", 0), _mem("new", 5))
    book.on_heartbeat(msgspec.structs.replace(_hb(2, 3), memory=swap), 20)
    held = _taken(book)
    assert len(held) == MAX_OWNER_MEMORY and "1" not in held and held["new"] == (5, 5)
