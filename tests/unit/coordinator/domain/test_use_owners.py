"""Owners as the use pass believes them (issue 32): a process naming a reservation is
that reservation's only when the id is a live reservation's; a unit has a bounded
number of owners, its holders' own kept first."""

from __future__ import annotations

import random
import string

from coordinator.domain.gpu_use_owners import (
    MAX_OWNERS_PER_UNIT,
    RESERVATION_ID,
    reservation_owners,
    vetted,
)
from shared.ids import new_reservation_id
from shared.wire import DeviceUse, ProcessUse

HOLDER = new_reservation_id()
OTHER = new_reservation_id()


def _made_up(i: int) -> str:
    """A reservation id nobody booked: half of them with a real one's pattern."""
    if i % 2:
        return new_reservation_id()
    return "rsv_" + "".join(random.choices(string.ascii_letters, k=26))


def _unit(*owners: tuple[str, str]) -> DeviceUse:
    return DeviceUse(
        device_id="GPU-0",
        processes=tuple(
            ProcessUse(pid=i, owner=o, owner_kind=k)  # type: ignore[arg-type]
            for i, (o, k) in enumerate(owners)
        ),
    )


def _owners(use: DeviceUse) -> set[tuple[str, str]]:
    return {(p.owner_kind, p.owner) for p in use.processes}


def test_a_reservation_id_that_names_no_live_reservation_is_nobody() -> None:
    made_up = [_made_up(i) for i in range(250)]
    use = _unit(
        (HOLDER, "reservation"), (OTHER, "reservation"), ("not-an-id", "reservation"),
        *((m, "reservation") for m in made_up),
    )  # fmt: skip
    uses = {"n1": {"GPU-0": use}}
    # Only ids with a reservation's pattern are worth a lookup.
    patterned = {m for m in made_up if RESERVATION_ID.match(m)}
    assert len(patterned) >= 125
    assert reservation_owners(uses) == {HOLDER, OTHER} | patterned
    out = vetted(uses, {HOLDER, OTHER}, {("n1", "GPU-0"): {HOLDER}})["n1"]["GPU-0"]
    assert _owners(out) == {("reservation", HOLDER), ("reservation", OTHER), ("unknown", "")}
    assert [p.pid for p in out.processes] == [p.pid for p in use.processes]
    # Nothing to believe otherwise: the same value back.
    plain = _unit((HOLDER, "reservation"), ("pod-1", "pod"))
    assert vetted({"n1": {"GPU-0": plain}}, {HOLDER}, {})["n1"]["GPU-0"] is plain


def test_a_unit_has_a_bounded_number_of_owners_its_holders_first() -> None:
    pods = [(f"pod-{i:03d}", "pod") for i in range(200)]
    use = _unit(*pods, (HOLDER, "reservation"), (OTHER, "reservation"))
    out = vetted({"n1": {"GPU-0": use}}, {HOLDER, OTHER}, {("n1", "GPU-0"): {HOLDER}})
    owners = _owners(out["n1"]["GPU-0"])
    assert len(owners) == MAX_OWNERS_PER_UNIT
    assert {("reservation", HOLDER), ("reservation", OTHER), ("unknown", "")} <= owners
    assert len(out["n1"]["GPU-0"].processes) == len(use.processes)


def test_an_owner_not_believed_loses_the_name_it_gave_too() -> None:
    liar = ProcessUse(pid=1, owner=_made_up(1), owner_kind="reservation", owner_name="boss")
    pod = ProcessUse(pid=2, owner="uid-1", owner_kind="pod", owner_name="ml/train-0")
    use = DeviceUse(device_id="GPU-0", processes=(liar, pod))
    out = vetted({"n1": {"GPU-0": use}}, set(), {})["n1"]["GPU-0"]
    assert [(p.owner_kind, p.owner, p.owner_name) for p in out.processes] == [
        ("unknown", "", ""), ("pod", "uid-1", "ml/train-0"),
    ]  # fmt: skip
