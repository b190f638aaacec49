from __future__ import annotations

import logging

import pytest

from procs.log_throttle import LogThrottle


def test_one_warning_per_key_per_period_with_the_count_held_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    throttle = LogThrottle(logging.getLogger("t"), every_s=10, monotonic=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="t"):
        for i in range(5):
            throttle.warning("too_large", "dropped %s", f"n{i}")
        throttle.warning("not_json", "dropped %s", "x")
        now[0] = 10.0
        throttle.warning("too_large", "dropped %s", "n9")
    assert [r.getMessage() for r in caplog.records] == [
        "dropped n0",
        "dropped x",
        "dropped n9 (and 4 more like it since)",
    ]
    assert {r.levelno for r in caplog.records} == {logging.WARNING}
