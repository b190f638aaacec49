"""The words a create records (`render.created_body`, built without the model for
speed) are exactly what dumping `ReservationOut` gives, key order included, whichever
optional parts apply: a replay answers them verbatim, and a reader of the list gets the
model's words for the same reservation."""

from __future__ import annotations

import itertools

import pytest

from coordinator.api.http.render import RESERVATION_ANSWERS, reservation
from coordinator.api.shapes import outputs as out
from coordinator.api.shapes.base import dump
from coordinator.domain.reservation import LIVE, AtRisk, BookedAtom, Reservation
from shared.ids import new_pool_id, new_reservation_id

HOUR = 3_600_000


def _reservation(options: tuple[bool, ...]) -> Reservation:
    project, lease, noticed, resources, gang, ended, risk = options
    return Reservation(
        reservation_id=new_reservation_id(),
        tenant_id="acme",
        pool_id=new_pool_id(),
        project_id="prj_01hzy3k4m5n6p7q8r9s0t1v2w3" if project else None,
        stored_state="released" if ended else LIVE,
        spot=noticed,
        binding="hold",
        start=10 * HOUR,
        end=12 * HOUR,
        lease_seconds=600 if lease else None,
        lease_expires_at=10 * HOUR + 600_000 if lease else None,
        preempt_at=11 * HOUR if noticed else None,
        resources={"vcpu": 8, "memoryGiB": 64} if resources else {},
        gang={"size": 2, "topologyKey": "rack"} if gang else None,
        atoms=(BookedAtom("n1:gpu:0", "n1", "gpu"), BookedAtom("n1:gpu:1", "n1", "gpu")),
        created_at=9 * HOUR,
        ended_at=10 * HOUR + 5 if ended else None,
        at_risk=AtRisk("unhealthy", 9 * HOUR, ("n1:gpu:1",)) if risk else None,
    )


@pytest.mark.parametrize("options", list(itertools.product((False, True), repeat=7)))
@pytest.mark.parametrize("now", [9 * HOUR, 10 * HOUR + HOUR // 2])
def test_the_words_a_create_records_are_the_models_dump(
    options: tuple[bool, ...], now: int
) -> None:
    res = _reservation(options)
    warnings = ("n1:gpu:1 runs a process no booking covers",) if options[0] else ()
    words = RESERVATION_ANSWERS.created(res, now, warnings)
    model = dump(reservation(res, now, warnings))
    assert words == model
    assert list(words) == list(model)
    assert out.ReservationOut.model_validate(words) == reservation(res, now, warnings)
