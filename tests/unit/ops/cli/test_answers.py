"""The CLI's short answer to a create keeps the coordinator's warnings in sight."""

from __future__ import annotations

from ops.cli.answers import short_answer


def test_a_create_that_took_a_gpu_in_unbooked_use_says_so() -> None:
    answer = {
        "reservationId": "rsv_1", "state": "active", "start": 0, "end": 3_600_000,
        "atoms": [{"atomId": "n1:gpu:GPU-n1-0", "nodeId": "n1", "class": "gpu"}],
        "warnings": ["n1:gpu:GPU-n1-0 on node n1 runs a process no booking covers"],
    }  # fmt: skip
    text = short_answer("reservations.create", {}, answer)
    assert text is not None
    first, warning = text.split("\n")
    assert first.startswith("rsv_1 active: 1 gpu on n1")
    assert warning == "warning: n1:gpu:GPU-n1-0 on node n1 runs a process no booking covers"
    del answer["warnings"]
    assert "\n" not in (short_answer("reservations.create", {}, answer) or "")
