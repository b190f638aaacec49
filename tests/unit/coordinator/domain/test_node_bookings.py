"""`coordinator.domain.node_bookings`: what an agent is told it holds. Each booked atom
names the device a launcher binds to (slots their GPU, MIG instances their own UUID,
VFs their PCI address), devices come in GPU index order, ended and terminal bookings
are left out, and the etag depends on the content only, never on the order rows came
in (two replicas agree)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from coordinator.domain.node_bookings import (
    EMPTY_ETAG,
    MAX_NODE_BOOKINGS,
    BookedRow,
    etag,
    next_change,
    node_bookings,
)
from coordinator.domain.reservation import LIVE, Reservation
from shared.wire import NodeBookings

T0 = 1_800_000_000_000
HOUR = 3_600_000


def res(rid: str, start: int = T0, end: int = T0 + HOUR, **kw: Any) -> Reservation:
    values: dict[str, Any] = dict(
        reservation_id=rid, tenant_id="acme", pool_id="pool_x", project_id=None,
        stored_state=LIVE, spot=False, binding="hold", start=start, end=end,
        lease_seconds=None, lease_expires_at=None, preempt_at=None, resources={}, gang=None,
        atoms=(), created_at=T0,
    )  # fmt: skip
    return Reservation(**(values | kw))


def row(
    rid: str, atom: str, cls: str, device: str = "", node: str = "n0", **attrs: Any
) -> BookedRow:
    r = RESERVATIONS.get(rid)
    start, end = (r.start, r.end) if r else (T0, T0 + HOUR)
    return BookedRow(rid, node, "pool_x", start, end, f"{node}:{atom}", cls, device, attrs)


RESERVATIONS = {"r1": res("r1"), "r2": res("r2", start=T0 + HOUR, end=T0 + 2 * HOUR)}
ROWS = [
    row("r1", "gpu:GPU-b", "gpu", "GPU-b", gpuIndex=3, uuid="GPU-b"),
    row("r1", "gpu:GPU-a", "gpu", "GPU-a", gpuIndex=1, uuid="GPU-a"),
    row("r1", "gpu.mig:MIG-1", "gpu.mig", "GPU-m", gpuIndex=2, gpuInstanceId=5, uuid="MIG-1"),
    row("r1", "gpu.mig:MIG-0", "gpu.mig", "GPU-m", gpuIndex=2, gpuInstanceId=1, uuid="MIG-0"),
    row(
        "r1", "nic.vf:0000:1a:00.2", "nic.vf", "0000:1a:00.0", pciAddress="0000:1a:00.2", vfIndex=1
    ),
    row("r1", "disk:wwn-1", "disk", "wwn-1"),
    row("r2", "gpu.slot:GPU-s:1", "gpu.slot", "GPU-s", gpuIndex=0, replica=1),
    row("r2", "gpu.slot:GPU-s:0", "gpu.slot", "GPU-s", gpuIndex=0, replica=0),
    row("r2", "gpu:GPU-x", "gpu", "GPU-x", node="n1", gpuIndex=0, uuid="GPU-x"),
]


def test_each_atom_names_the_device_to_bind_in_device_index_order() -> None:
    by_node = node_bookings(ROWS, RESERVATIONS, T0)
    assert set(by_node) == {"n0", "n1"}
    first, later = by_node["n0"]
    assert (first.reservation_id, first.state, first.tenant_id) == ("r1", "active", "acme")
    assert [(d.cls, d.device_id, d.pci_address) for d in first.devices] == [
        ("gpu", "GPU-a", None),
        ("gpu.mig", "MIG-0", None),  # the instance's UUID, not its GPU's
        ("gpu.mig", "MIG-1", None),
        ("gpu", "GPU-b", None),
        ("nic.vf", "0000:1a:00.0", "0000:1a:00.2"),
        ("disk", "wwn-1", None),
    ]
    assert (later.reservation_id, later.state) == ("r2", "scheduled")
    # Slots are their GPU's: a launcher sees one GPU, twice booked.
    assert [(d.cls, d.device_id, d.atom_id) for d in later.devices] == [
        ("gpu.slot", "GPU-s", "n0:gpu.slot:GPU-s:0"),
        ("gpu.slot", "GPU-s", "n0:gpu.slot:GPU-s:1"),
    ]
    assert [b.reservation_id for b in by_node["n1"]] == ["r2"]  # per node, not per reservation


def test_ended_and_terminal_bookings_are_left_out() -> None:
    ended = node_bookings(ROWS, RESERVATIONS, T0 + HOUR)
    assert [b.reservation_id for b in ended["n0"]] == ["r2"]
    assert ended["n0"][0].state == "active"
    released = RESERVATIONS | {"r1": res("r1", stored_state="released")}
    assert [b.reservation_id for b in node_bookings(ROWS, released, T0)["n0"]] == ["r2"]
    assert node_bookings(ROWS, RESERVATIONS, T0 + 2 * HOUR) == {}
    assert etag(()) == EMPTY_ETAG


def test_the_clock_alone_changes_them_at_starts_ends_notices_and_leases() -> None:
    noticed = RESERVATIONS | {"r1": res("r1", preempt_at=T0 + 600_000)}
    bookings = node_bookings(ROWS, noticed, T0)["n0"]
    assert bookings[0].state == "noticed"
    assert next_change(bookings, noticed, T0) == T0 + 600_000
    assert next_change(bookings, RESERVATIONS, T0) == T0 + HOUR  # r1 ends, r2 starts
    assert next_change(bookings, RESERVATIONS, T0 + 2 * HOUR) is None


@given(st.permutations(ROWS))
def test_the_etag_is_the_contents_whatever_order_rows_come_in(rows: list[BookedRow]) -> None:
    expected = node_bookings(ROWS, RESERVATIONS, T0)
    got = node_bookings(rows, RESERVATIONS, T0)
    assert got == expected
    assert {n: etag(b) for n, b in got.items()} == {n: etag(b) for n, b in expected.items()}


def test_the_etag_moves_with_any_change_of_content() -> None:
    base = etag(node_bookings(ROWS, RESERVATIONS, T0)["n0"])
    renewed = [replace(r, end=r.end + HOUR) if r.reservation_id == "r1" else r for r in ROWS]
    assert etag(node_bookings(renewed, RESERVATIONS, T0)["n0"]) != base
    other_tenant = RESERVATIONS | {"r1": res("r1", tenant_id="globex")}
    assert etag(node_bookings(ROWS, other_tenant, T0)["n0"]) != base
    assert etag(node_bookings(ROWS[1:], RESERVATIONS, T0)["n0"]) != base


def test_a_node_is_told_its_earliest_bookings_up_to_what_an_agent_accepts() -> None:
    many = {f"r{k:05d}": res(f"r{k:05d}", start=T0 + k, end=T0 + HOUR) for k in range(4100)}
    rows = [
        BookedRow(rid, "n0", "pool_x", r.start, r.end, f"n0:disk:{rid}", "disk", rid, {})
        for rid, r in many.items()
    ]
    told = node_bookings(rows, many, T0)["n0"]
    assert len(told) == MAX_NODE_BOOKINGS == 4096
    assert told[-1].reservation_id == "r04095"
    wire = NodeBookings(node_id="n0", etag=etag(told), sent_at=T0, bookings=told)
    assert NodeBookings.from_json(wire.to_json()) == wire  # within the wire's bounds
