"""Expected node shapes, the pure rules (`coordinator.domain.shapes`)."""

from __future__ import annotations

import dataclasses

from msgspec.structs import replace

from coordinator.domain.shapes import counts_of, excess, hold_reason, judged
from coordinator.domain.transitions import NodeFlags, node_transitions
from shared.wire import Atom
from tests.factories import make_inventory


def test_counts_leave_out_placeholders_of_absent_devices() -> None:
    inv = make_inventory("n", "p", gpus=2, nics=1)
    placeholder = Atom(atom_id="n:gpu:missing:0", cls="gpu", device_id="missing:gpu-2")
    inv = replace(inv, atoms=(*inv.atoms, placeholder))
    assert counts_of(inv) == {"gpu": 2, "nic.vf": 1, "node": 1}


def test_only_more_than_expected_holds_and_what_was_accepted_does_not() -> None:
    assert excess({"gpu": 9, "nic.vf": 8}, {"gpu": 8, "nic.vf": 32}) == ["gpu 9 > 8"]
    assert excess({"gpu": 4}, {"gpu": 8, "disk": 2}) == []
    shapes = [{"gpu": 8}, {"gpu": 8, "nic.vf": 4}]
    counts = {"gpu": 9, "nic.vf": 5, "node": 1}
    assert hold_reason(counts, shapes, None) == (
        "inventory exceeds the expected shape: gpu 9 > 8, nic.vf 5 > 4"
    )
    assert hold_reason(counts, shapes, {"gpu": 9, "nic.vf": 5, "node": 1}) == ""
    assert hold_reason({**counts, "gpu": 10}, shapes, {"gpu": 9, "nic.vf": 5, "node": 1})
    assert hold_reason(counts, [], None) == ""


def test_a_hold_is_provisioning_with_its_reason_and_ends_as_the_agent_says() -> None:
    ready = NodeFlags("p")
    held = judged(ready, "inventory exceeds the expected shape: gpu 9 > 8")
    assert held.provisioning and held.shape_hold
    (t,) = node_transitions(ready, held)
    assert (t.kind, t.reason) == ("node.provisioning", held.shape_hold)
    assert not judged(dataclasses.replace(held, provisioning=False), "").provisioning
    assert judged(dataclasses.replace(held, provisioning=True), "").provisioning
