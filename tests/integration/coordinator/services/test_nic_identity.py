"""A NIC is one device wherever it shows (issue 31), on SQLite and PostgreSQL: a NIC
whose card identity (`NicInfo.physical_id`: node GUID, permanent MAC or VPD serial)
another node holds, live or booked, is never offered twice. The node showing it is held
in provisioning with the reason and an alert naming both nodes, the placer skips it,
and `nodes.replace` says which is real; as for GPUs (test_physical_identity.py). A NIC
without one (an older agent) or with a form the ledger does not know is not compared."""

from __future__ import annotations

from coordinator.domain.placer import DUPLICATE_DEVICES
from coordinator.ledger import Ledger
from coordinator.services.node_records import (
    hold_duplicates,
    record_inventory,
    record_reachability,
    replace_node,
)
from coordinator.services.reservations import Created, Refused
from shared.wire import Atom, Inventory, NicInfo
from tests.factories import make_inventory, renamed, unchecked
from tests.integration.coordinator.services.duplicate_hosts import (
    as_upgraded,
    hold_reason,
    registered_twice_at_once,
)
from tests.rig import Rig

NIC = [{"class": "nic.vf", "count": 1}]


def host(node_id: str, pool: str, ids: list[str], *, gpus: int = 0,
         management: str = "") -> Inventory:  # fmt: skip
    """A host with one bookable NIC per identity in `ids` (at the same PCI addresses on
    every host, as on hosts of one model) and, when `management` is given, a management
    NIC with that identity and no atom."""
    inv = make_inventory(node_id, pool, gpus=gpus)
    nics = [
        NicInfo(name=f"ens{k}", pci_address=f"0000:{0x17 + k:02x}:00.0", physical_id=pid)
        for k, pid in enumerate(ids)
    ]
    atoms = [
        Atom(atom_id=f"{node_id}:nic:{n.pci_address}", cls="nic.vf",
             device_id=str(n.pci_address),
             attrs={"physicalId": n.physical_id or None, "sriov": False})
        for n in nics
    ]  # fmt: skip
    if management:
        nics.append(NicInfo(name="eno1", pci_address="0000:4b:00.0", physical_id=management,
                            bookable=False))  # fmt: skip
    return unchecked(inv, atoms=(*inv.atoms, *atoms), nics=tuple(nics))


async def test_one_nic_under_two_node_ids_is_held_and_not_offered(ledger: Ledger) -> None:
    rig = await Rig.open(ledger)
    pool = await rig.pool(nodes=0)
    now = rig.clock.now_ms()
    a = host("a", pool, ["mac:b8:ce:f6:00:00:01", "guid:a088:c203:0001:0002"])
    await record_inventory(ledger, a, now)
    booked = await rig.reservations.create(rig.request(pool, "k1", devices=NIC * 2))
    assert isinstance(booked, Created), booked

    changes = await record_inventory(ledger, renamed(a, "b"), now)

    reason = await hold_reason(ledger, "b")
    assert reason == (
        "duplicateDevice: guid:a088:c203:0001:0002, mac:b8:ce:f6:00:00:01 held by node a"
    )
    (alert,) = [x for x in changes.alerts if x.kind == "node.duplicateDevice"]
    assert alert.node_id == "b" and alert.details["otherNodeIds"] == ["a"]
    assert "mac:b8:ce:f6:00:00:01" in alert.details["devices"]
    nic = await rig.row(pool, "nic.vf")
    assert (nic.allocatable, nic.provisioning, nic.available) == (2, 2, 0)
    assert isinstance(await rig.reservations.create(rig.request(pool, "k2", devices=NIC)), Refused)
    assert await hold_reason(ledger, "a") == ""
    assert await ledger.rebuild_all(now) == 0


async def test_the_management_nic_alone_says_it_is_the_same_host(ledger: Ledger) -> None:
    """Not bookable, so it has no atom, but it is the host's own card all the same."""
    rig = await Rig.open(ledger)
    pool = await rig.pool(nodes=0)
    now = rig.clock.now_ms()
    await record_inventory(ledger, host("a", pool, [], gpus=1, management="vpd:MT2231X01"), now)

    await record_inventory(ledger, host("b", pool, [], gpus=1, management="vpd:MT2231X01"), now)

    assert await hold_reason(ledger, "b") == "duplicateDevice: vpd:MT2231X01 held by node a"
    assert (await rig.row(pool, "gpu")).allocatable == 1


async def test_nics_without_an_identity_the_ledger_knows_are_not_compared(
    ledger: Ledger,
) -> None:
    """Hosts of one model share PCI addresses; an older agent sends no identity, and a
    form the ledger does not know (a newer agent's) is not compared either."""
    rig = await Rig.open(ledger)
    pool = await rig.pool(nodes=0)
    now = rig.clock.now_ms()
    same = ["", "eui:0001"]
    await record_inventory(ledger, host("x", pool, ["mac:b8:ce:f6:00:00:0a", *same]), now)
    await record_inventory(ledger, host("y", pool, ["mac:b8:ce:f6:00:00:0b", *same]), now)

    assert await hold_reason(ledger, "x") == "" and await hold_reason(ledger, "y") == ""
    assert (await rig.row(pool, "nic.vf")).available == 6


async def test_a_dead_unbooked_holder_gives_its_nic_up_and_coming_back_is_not_offered(
    ledger: Ledger,
) -> None:
    rig = await Rig.open(ledger)
    pool = await rig.pool(nodes=0)
    now = rig.clock.now_ms()
    a = host("a", pool, ["mac:b8:ce:f6:00:00:01"])
    await record_inventory(ledger, a, now)
    await record_reachability(ledger, ["a"], False, now)

    await record_inventory(ledger, renamed(a, "b"), now)

    assert await hold_reason(ledger, "b") == ""
    assert isinstance(await rig.reservations.create(rig.request(pool, "k", devices=NIC)), Created)
    # The old id back by a heartbeat alone shows a NIC the new one holds: held for it
    # (as for GPUs), so not offered.
    await record_reachability(ledger, ["a"], True, now)
    assert "node b" in await hold_reason(ledger, "a")
    again = await rig.reservations.create(rig.request(pool, "k2", devices=NIC))
    assert isinstance(again, Refused)
    await record_inventory(ledger, renamed(a, "a", sent_at=9), now)
    assert "node b" in await hold_reason(ledger, "a")


async def test_the_placer_never_offers_a_nic_another_node_id_holds(
    ledger: Ledger, database_url: str
) -> None:
    """Both ids admitted (as a ledger upgraded while both were registered could have
    them): only the holder is offered, and capacity agrees."""
    rig = await Rig.open(ledger)
    pool = await rig.pool(nodes=0)
    now = rig.clock.now_ms()
    a = host("a", pool, ["guid:a088:c203:0001:0002"])
    await record_inventory(ledger, a, now)
    await record_inventory(ledger, renamed(a, "b"), now)
    await as_upgraded(database_url)
    await ledger.rebuild_all(now)

    ask = rig.request(pool, "p", devices=NIC)
    seen = await ledger.bookings.preview(pool, ask.placement, now, now + 3_600_000, now, 0)
    assert [p.node_id for p in seen.placement.candidates] == ["a"]
    assert seen.placement.filtered == {DUPLICATE_DEVICES: 1}
    made = [await rig.reservations.create(rig.request(pool, f"k{k}", devices=NIC)) for k in (1, 2)]
    assert [type(m) for m in made] == [Created, Refused]
    assert isinstance(made[0], Created)
    assert [x.node_id for x in made[0].reservation.atoms] == ["a"]
    # What the coordinator's start does: the second id held for the NIC; capacity agrees.
    (held,) = await hold_duplicates(ledger, now)
    assert held.node_id == "b" and "node a" in await hold_reason(ledger, "b")
    nic = await rig.row(pool, "nic.vf")
    assert (nic.allocatable, nic.provisioning, nic.available) == (1, 1, 0)
    assert await ledger.rebuild_all(now) == 0


async def test_replace_moves_a_nic_booking_and_lets_the_new_node_go(ledger: Ledger) -> None:
    rig = await Rig.open(ledger)
    pool = await rig.pool(nodes=0)
    now = rig.clock.now_ms()
    a = host("a", pool, ["mac:b8:ce:f6:00:00:01"], management="mac:b8:ce:f6:00:00:99")
    await record_inventory(ledger, a, now)
    booked = await rig.reservations.create(rig.request(pool, "k1", devices=NIC))
    assert isinstance(booked, Created)
    await record_inventory(ledger, renamed(a, "b"), now)
    assert "mac:b8:ce:f6:00:00:99" in await hold_reason(ledger, "b")

    done = await replace_node(ledger, "a", "b", "ops", now)

    assert (done.moved, done.ended) == ((booked.reservation.reservation_id,), ())
    assert await hold_reason(ledger, "b") == ""
    assert await hold_reason(ledger, "a") == "replaced by node b"
    moved = await ledger.reservations.get(booked.reservation.reservation_id, None)
    assert [x.atom_id for x in moved.atoms] == ["b:nic:0000:17:00.0"]
    assert isinstance(await rig.reservations.create(rig.request(pool, "k2", devices=NIC)), Refused)
    assert await ledger.rebuild_all(now) == 0


async def test_two_replicas_registering_one_hosts_nics_under_two_ids_offer_them_once(
    ledger: Ledger, database_url: str
) -> None:
    rig = await Rig.open(ledger)
    pool = await rig.pool(nodes=0)
    now = rig.clock.now_ms()
    hosts = [host(f"h{k}", pool, [f"mac:b8:ce:f6:00:01:{k:02x}"]) for k in range(6)]
    await registered_twice_at_once(ledger, database_url, hosts, now)
    nic = await rig.row(pool, "nic.vf")
    assert (nic.allocatable, nic.provisioning) == (6, 6)
    assert await ledger.rebuild_all(now) == 0
