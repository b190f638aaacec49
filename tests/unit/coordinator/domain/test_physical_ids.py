"""Physical identity (issue 31), pure: which devices are one device wherever they show,
the hold's reason and transition, and what `nodes.replace` moves or ends."""

from __future__ import annotations

from coordinator.domain.node_replacement import HeldAtom, counterpart, plan
from coordinator.domain.physical_ids import (
    Collision,
    atom_identities,
    duplicate_device,
    hold_reason,
    identities_of,
    is_physical_device,
    judged,
    kept,
    replaced_reason,
)
from coordinator.domain.transitions import NodeFlags
from shared.wire import Atom, NicInfo
from tests.factories import backed, make_inventory, renamed, unchecked


def test_gpus_migs_slots_and_disks_by_serial_are_identities_nics_and_paths_are_not() -> None:
    inv = make_inventory("n", "p", gpus=1, mig=2, nics=1)
    extra = (
        Atom(atom_id="n:gpu.slot:GPU-s:0", cls="gpu.slot", device_id="GPU-s"),
        Atom(atom_id="n:disk:a", cls="disk", device_id="wwn:eui.1"),
        Atom(atom_id="n:disk:b", cls="disk", device_id="serial:S1:ns1"),
        Atom(atom_id="n:disk:c", cls="disk", device_id="path:0000:3b:00.0"),
        Atom(atom_id="n:gpu:missing-0", cls="gpu", device_id="missing:gpu:0"),
    )
    inv = backed(renamed(inv, "n", atoms=(*inv.atoms, *extra)))

    assert identities_of(inv) == {
        "gpu:GPU-n-0": "GPU-n-0",
        "gpu:GPU-n-mig": "GPU-n-mig",
        "mig:MIG-n-0": "MIG-n-0",
        "mig:MIG-n-1": "MIG-n-1",
        "gpu:GPU-s": "GPU-s",
        "disk:wwn:eui.1": "wwn:eui.1",
        "disk:serial:S1:ns1": "serial:S1:ns1",
    }
    assert [is_physical_device(d) for d in ("GPU-1", "wwn:x", "serial:y")] == [True] * 3
    assert [is_physical_device(d) for d in ("", "0000:17:00.0", "path:x", "nic0")] == [False] * 4


def test_a_nics_card_identity_is_one_wherever_it_shows_bookable_or_not() -> None:
    """`NicInfo.physical_id` of every NIC, the management one included, and the
    `physicalId` its atoms carry; none (an older agent) or an unknown form: not compared."""
    nics = (
        NicInfo(name="ens1", pci_address="0000:17:00.0", physical_id="guid:a088:c203:0:1"),
        NicInfo(name="eno1", pci_address="0000:4b:00.0", physical_id="mac:b8:ce:f6:0:0:1",
                bookable=False),
        NicInfo(name="ens2", pci_address="0000:18:00.0", physical_id="vpd:MT1"),
        NicInfo(name="ens3", pci_address="0000:19:00.0", physical_id="eui:1"),
        NicInfo(name="ens4", pci_address="0000:1a:00.0"),
    )  # fmt: skip
    inv = make_inventory("n", "p", gpus=0)
    atoms = tuple(
        Atom(atom_id=f"n:nic:{n.pci_address}", cls="nic.vf", device_id=str(n.pci_address),
             attrs={"physicalId": n.physical_id or None})
        for n in nics if n.bookable
    )  # fmt: skip
    inv = unchecked(inv, atoms=(*inv.atoms, *atoms), nics=nics)

    assert identities_of(inv) == {
        "nic:guid:a088:c203:0:1": "guid:a088:c203:0:1",
        "nic:mac:b8:ce:f6:0:0:1": "mac:b8:ce:f6:0:0:1",
        "nic:vpd:MT1": "vpd:MT1",
    }
    assert atom_identities("nic.vf", "0000:18:00.0", {"physicalId": "vpd:MT1"}) == {
        "nic:vpd:MT1": "vpd:MT1"
    }
    assert atom_identities("nic.vf", "0000:18:00.0", {"physicalId": None}) == {}


def test_the_reason_names_every_other_node_and_at_most_three_devices_each() -> None:
    found = [Collision(f"gpu:G{i}", f"G{i}", "a") for i in range(5)]
    found += [Collision("disk:serial:S", "serial:S", "c"), Collision("mig:M", "G0", "a")]

    assert hold_reason(found) == (
        "duplicateDevice: G0, G1, G2 and 2 more held by node a; serial:S held by node c"
    )
    assert hold_reason([]) == ""


def test_the_hold_is_kept_until_an_operator_ends_it_and_said_once() -> None:
    free = NodeFlags("p")
    held = judged(free, "duplicateDevice: G0 held by node a")
    assert held.provisioning and held.duplicate_hold.endswith("node a")
    assert kept(held, "") == held.duplicate_hold
    assert kept(held, "duplicateDevice: G0 held by node c") == "duplicateDevice: G0 held by node c"
    retired = judged(free, replaced_reason("b"))
    assert kept(retired, "duplicateDevice: G0 held by node b") == "replaced by node b"
    assert kept(None, "") == ""
    assert not judged(free, "").provisioning

    found = [Collision("gpu:G0", "G0", "a")]
    (said,) = duplicate_device(None, held, found)
    assert said.details == {"otherNodeIds": ["a"], "devices": ["G0"]}
    assert said.kind == "node.duplicateDevice" and said.reason == held.duplicate_hold
    assert duplicate_device(held, held, found) == ()
    assert duplicate_device(None, free, []) == ()


def _h(rid: str, atom: str, start: int = 0, end: int = 10) -> HeldAtom:
    return HeldAtom(rid, atom, start, end)


def test_a_reservation_moves_only_whole_to_the_same_devices_in_one_pool() -> None:
    held = [_h("r1", "a:gpu:G0"), _h("r1", "a:gpu:G1"), _h("r2", "a:gpu:G2"),
            _h("r3", "a:gpu:G3", 20, 30)]  # fmt: skip
    new_atoms = {"b:gpu:G0", "b:gpu:G1", "b:gpu:G3"}
    busy = [_h("x", "b:gpu:G3", 25, 40)]

    got = plan("a", "b", held, new_atoms, busy, same_pool=True, also=["r4"])

    assert got.moves == {"r1": {"a:gpu:G0": "b:gpu:G0", "a:gpu:G1": "b:gpu:G1"}, "r4": {}}
    assert got.ends == ("r2", "r3")
    other_pool = plan("a", "b", held[:2], new_atoms, [], same_pool=False)
    assert (other_pool.moves, other_pool.ends) == ({}, ("r1",))
    assert counterpart("a:gpu.mig:MIG-1", "a", "b") == "b:gpu.mig:MIG-1"
    after = plan("a", "b", [_h("r5", "a:gpu:G3", 40, 50)], new_atoms, busy, same_pool=True)
    assert after.moves == {"r5": {"a:gpu:G3": "b:gpu:G3"}}
