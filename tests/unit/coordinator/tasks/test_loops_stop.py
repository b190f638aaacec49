"""`Loops.stop` ends every loop even when a body swallowed the cancellation: Python
3.11's `asyncio.wait_for` returns normally when the awaited event is set in the same
instant the task is cancelled (the outbox relay's wake-up during a registration burst),
and the loop then went on forever while `stop` waited for it (bench/registration_bench
hung at a coordinator's shutdown)."""

from __future__ import annotations

import asyncio

from coordinator.tasks.loops import Loops


async def test_stop_ends_a_loop_whose_body_swallowed_the_cancel() -> None:
    entered = asyncio.Event()
    rounds = 0

    async def swallowing() -> None:
        nonlocal rounds
        rounds += 1
        entered.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            return  # what wait_for does when its event fired as the cancel arrived

    loops = Loops()
    loops.add("swallowing", 0.0, swallowing)
    loops.start()
    await entered.wait()
    await loops.stop()
    assert rounds == 1
