"""A coordinator part that never finishes stopping cannot hold the process open."""

from __future__ import annotations

import asyncio
import logging

import pytest

from coordinator.tasks.shutdown import bounded


async def test_a_stuck_step_is_named_cancelled_and_left_behind(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cancelled = asyncio.Event()

    async def stuck() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()

    await asyncio.wait_for(bounded("bus", stuck, timeout_s=0.1)(), timeout=5)
    assert cancelled.is_set()
    assert any(
        r.levelno == logging.ERROR and "bus did not finish" in r.getMessage()
        for r in caplog.records
    )


async def test_a_step_that_finishes_in_time_is_awaited_and_its_error_raised() -> None:
    done: list[str] = []

    async def quick() -> None:
        await asyncio.sleep(0)
        done.append("quick")

    async def broken() -> None:
        raise RuntimeError("pool already closed")

    await bounded("ledger", quick, timeout_s=5)()
    assert done == ["quick"]
    with pytest.raises(RuntimeError, match="pool already closed"):
        await bounded("ledger", broken, timeout_s=5)()
