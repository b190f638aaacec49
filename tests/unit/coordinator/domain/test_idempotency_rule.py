"""The idempotency rule without a database: a retry with the same body (however its
keys are ordered) replays the first answer, another body under the key is refused."""

from __future__ import annotations

import pytest

from coordinator.domain.errors import IdempotencyKeyConflict
from coordinator.domain.idempotency import Recorded, Stored, body_hash, matching


def test_the_same_body_in_any_key_order_hashes_alike() -> None:
    first = {"poolId": "p1", "shape": {"gpus": 2, "class": "gpu"}, "name": "é"}
    again = {"name": "é", "shape": {"class": "gpu", "gpus": 2}, "poolId": "p1"}
    assert body_hash(first) == body_hash(again)
    assert body_hash(first) != body_hash({**first, "name": "e"})


def test_a_retry_replays_the_first_answer_and_another_body_is_a_conflict() -> None:
    answer = Recorded(200, {"reservationId": "r1"})
    stored = Stored(body_hash({"n": 1}), answer)
    assert matching(stored, "k1", body_hash({"n": 1})) is answer
    with pytest.raises(IdempotencyKeyConflict) as refused:
        matching(stored, "k1", body_hash({"n": 2}))
    assert refused.value.details == {"idempotencyKey": "k1"}
