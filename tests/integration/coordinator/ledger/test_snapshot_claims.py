"""The pool snapshot the placer reads, over a real ledger: bookings on forms a device no
longer has still hold the device, and NVLink cliques come from the stored link matrix."""

from __future__ import annotations

from typing import Any

from coordinator.domain.booking import Booked, BookingRequest, NotPlaced
from coordinator.domain.placement_model import DeviceRequest, PlacementRequest
from coordinator.ledger import Ledger
from coordinator.services.node_records import record_inventory
from shared.ids import new_pool_id
from shared.wire import Atom, GpuInfo, Inventory, NodeHealth, Scalars

NOW = 1_700_000_000_000
HOUR = 3_600_000


def inventory(
    pool: str, gpus: list[Atom], infos: tuple[GpuInfo, ...] = (), tag: str = ""
) -> Inventory:
    if not infos:  # the devices behind the atoms, as an agent would list them
        forms: dict[str, list[Atom]] = {}
        for atom in gpus:
            forms.setdefault(atom.device_id, []).append(atom)
        infos = tuple(
            _info(int(dev[1:]), (), sharing="timeslice" if atoms[0].cls == "gpu.slot" else
                  "exclusive", replicas=len(atoms))
            for dev, atoms in forms.items()
        )  # fmt: skip
    return Inventory(
        node_id="n0", pool_id=pool, boot_id="b", sent_at=0, inventory_hash=f"h{tag}",
        scalars=Scalars(vcpu=64, memory_gib=512), health=NodeHealth(status="healthy"),
        atoms=(Atom(atom_id="n0:node", cls="node"), *gpus), gpus=infos,
    )  # fmt: skip


def whole(i: int) -> Atom:
    return Atom(
        atom_id=f"n0:gpu:G{i}", cls="gpu", device_id=f"G{i}", attrs={"nvlinkClique": "nvl0"}
    )


def slots(i: int, replicas: int) -> list[Atom]:
    return [
        Atom(atom_id=f"n0:gpu.slot:G{i}:{k}", cls="gpu.slot", device_id=f"G{i}")
        for k in range(replicas)
    ]


def booking(pool: str, cls: str, count: int, start: int = NOW) -> BookingRequest:
    return BookingRequest(
        tenant_id="acme", pool_id=pool, project_id=None,
        placement=PlacementRequest(devices=(DeviceRequest(cls, count),)),
        start=start, duration_ms=HOUR, lease_seconds=None, resources={}, gang=None,
        notice_ms=120_000,
    )  # fmt: skip


async def book(ledger: Ledger, r: BookingRequest, now: int) -> Booked | NotPlaced:
    """One booking in its own unit of work, as the reservations service writes it."""
    async with ledger.transaction() as uow:
        out = await uow.bookings.book(r, now)
        await uow.commit()
    return out


async def _pool(ledger: Ledger) -> str:
    await ledger.tenants.create("acme", "Acme", NOW)
    pool = new_pool_id()
    await ledger.pools.create(pool, "p", "acme", None, NOW)
    return pool


async def _slots_free(ledger: Ledger, pool: str) -> set[str]:
    req = PlacementRequest(devices=(DeviceRequest("gpu.slot", 1),))
    placement = (await ledger.bookings.preview(pool, req, NOW, NOW + HOUR, NOW, 120_000)).placement
    return {a.atom_id.rsplit(":", 1)[0] for p in placement.candidates for a in p.atoms}


async def test_a_gpu_reconfigured_under_a_booking_keeps_its_new_forms_unbookable(
    ledger: Ledger, database_url: str
) -> None:
    pool = await _pool(ledger)
    await record_inventory(ledger, inventory(pool, [whole(0), whole(1)]), NOW)
    held = await book(ledger, booking(pool, "gpu", 1), NOW)
    assert isinstance(held, Booked)
    booked_device = held.reservation.atoms[0].atom_id.rsplit(":", 1)[1]
    # Both GPUs become time-slice GPUs of 2 slots: the booked atom id is retired.
    reconfigured = inventory(pool, [*slots(0, 2), *slots(1, 2)], tag="slots")
    await record_inventory(ledger, reconfigured, NOW + 1)
    other = {"G0": "G1", "G1": "G0"}[booked_device]
    assert await _slots_free(ledger, pool) == {f"n0:gpu.slot:{other}"}
    out = await book(ledger, booking(pool, "gpu.slot", 3, NOW + 2), NOW + 2)
    assert not isinstance(out, Booked)
    # A second coordinator, with nothing cached, reads the same from the database.
    replica = await Ledger.open(database_url)
    try:
        assert await _slots_free(replica, pool) == {f"n0:gpu.slot:{other}"}
    finally:
        await replica.close()


def _info(i: int, peers: tuple[str, ...], **kw: Any) -> GpuInfo:
    return GpuInfo(
        uuid=f"G{i}", index=i, name="H100", memory_mib=81559, pci_bus_id=f"0000:0{i}:00.0",
        nvlink_peers=peers, nvlink_clique="nvl0", **kw,
    )  # fmt: skip


async def test_nvlink_cliques_come_from_the_stored_link_matrix(ledger: Ledger) -> None:
    pool = await _pool(ledger)
    bridges = {0: (1,), 1: (0, 2), 2: (1, 3), 3: (2,)}
    chain = tuple(_info(i, tuple(f"0000:0{j}:00.0" for j in js)) for i, js in bridges.items())
    await record_inventory(ledger, inventory(pool, [whole(i) for i in range(4)], chain), NOW)
    four = PlacementRequest(devices=(DeviceRequest("gpu", 4),), topology="nvlink-all")
    two = PlacementRequest(devices=(DeviceRequest("gpu", 2),), topology="nvlink-all")
    placement = (await ledger.bookings.preview(pool, four, NOW, NOW + HOUR, NOW, 120_000)).placement
    assert not placement.fits
    placement = (await ledger.bookings.preview(pool, two, NOW, NOW + HOUR, NOW, 120_000)).placement
    assert placement.fits
    # Behind an NVSwitch every GPU is linked to every other.
    switched = tuple(_info(i, ("0000:a0:00.0",)) for i in range(4))
    inv = inventory(pool, [whole(i) for i in range(4)], switched, tag="switch")
    await record_inventory(ledger, inv, NOW + 1)
    placement = (await ledger.bookings.preview(pool, four, NOW, NOW + HOUR, NOW, 120_000)).placement
    assert placement.fits


async def test_a_device_repartitioned_under_a_booking_whose_atom_id_stays_holds_the_device(
    ledger: Ledger, database_url: str
) -> None:
    """A GPU goes from 2 time-slice slots to 4: the booked slot's atom id (`…:G0:0`) is
    still in the inventory, but the booking was made on the old partition, which the
    database holds the whole device for (one form at a time): none of the new slots is
    free under it (the soak found the placer offering them; PostgreSQL then refused the
    write as a 503, SQLite would have promised the device twice)."""
    pool = await _pool(ledger)
    await record_inventory(ledger, inventory(pool, [*slots(0, 2), *slots(1, 2)]), NOW)
    held = await book(ledger, booking(pool, "gpu.slot", 1), NOW)
    assert isinstance(held, Booked)
    booked_device = held.reservation.atoms[0].atom_id.split(":")[2]
    reconfigured = inventory(pool, [*slots(0, 4), *slots(1, 4)], tag="four")
    await record_inventory(ledger, reconfigured, NOW + 1)
    other = {"G0": "G1", "G1": "G0"}[booked_device]
    assert await _slots_free(ledger, pool) == {f"n0:gpu.slot:{other}"}
    out = await book(ledger, booking(pool, "gpu.slot", 5, NOW + 2), NOW + 2)
    assert isinstance(out, NotPlaced)
    replica = await Ledger.open(database_url)
    try:
        assert await _slots_free(replica, pool) == {f"n0:gpu.slot:{other}"}
    finally:
        await replica.close()
