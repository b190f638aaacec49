"""Group commit's queueing, without a database: who shares a batch, and that every
request hears its own outcome — or the runner's error — exactly once."""

from __future__ import annotations

import asyncio

from coordinator.services.group_commit import GroupCommit


async def test_requests_queued_together_share_a_batch_and_get_their_own_outcomes() -> None:
    seen: list[list[int]] = []

    async def run(items: list[int]) -> list[int | Exception]:
        seen.append(items)
        await asyncio.sleep(0)
        return [ValueError(f"odd {n}") if n % 2 else n * 10 for n in items]

    group: GroupCommit[int, int] = GroupCommit()
    outcomes = await asyncio.gather(
        *(group.submit("pool", n, run) for n in range(4)), return_exceptions=True
    )
    assert seen == [[0, 1, 2, 3]]
    assert outcomes[0] == 0 and outcomes[2] == 20
    assert isinstance(outcomes[1], ValueError) and str(outcomes[1]) == "odd 1"
    assert isinstance(outcomes[3], ValueError)


async def test_keys_batch_apart_and_a_batch_is_capped() -> None:
    seen: list[tuple[int, ...]] = []

    async def run(items: list[int]) -> list[int | Exception]:
        seen.append(tuple(items))
        return list(items)

    group: GroupCommit[int, int] = GroupCommit(max_batch=2)
    got = await asyncio.gather(
        group.submit("a", 1, run), group.submit("b", 2, run), group.submit("a", 3, run),
        group.submit("a", 4, run),
    )  # fmt: skip
    assert got == [1, 2, 3, 4]
    assert sorted(seen) == [(1, 3), (2,), (4,)]


async def test_a_failing_runner_fails_its_batch_only_and_the_next_batch_runs() -> None:
    calls = 0

    async def run(items: list[str]) -> list[str | Exception]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("the batch failed")
        return [item.upper() for item in items]

    group: GroupCommit[str, str] = GroupCommit(max_batch=1)
    first, second = await asyncio.gather(
        group.submit("p", "x", run), group.submit("p", "y", run), return_exceptions=True
    )
    assert isinstance(first, RuntimeError)
    assert second == "Y"


async def test_a_cancelled_request_is_left_out_of_the_batch() -> None:
    seen: list[list[str]] = []
    started, release = asyncio.Event(), asyncio.Event()

    async def run(items: list[str]) -> list[str | Exception]:
        seen.append(items)
        started.set()
        await release.wait()
        return items

    group: GroupCommit[str, str] = GroupCommit()
    running = asyncio.create_task(group.submit("p", "first", run))
    await started.wait()
    gone = asyncio.create_task(group.submit("p", "gone", run))
    kept = asyncio.create_task(group.submit("p", "kept", run))
    await asyncio.sleep(0)
    gone.cancel()
    release.set()
    assert await running == "first"
    assert await kept == "kept"
    assert seen == [["first"], ["kept"]]


async def test_drain_waits_for_a_batch_whose_submitter_stopped_waiting() -> None:
    """Shutdown: the HTTP handler is gone, but the batch it joined still commits."""
    release = asyncio.Event()
    ran: list[list[int]] = []

    async def run(items: list[int]) -> list[int | Exception]:
        await release.wait()
        ran.append(items)
        return list(items)

    group: GroupCommit[int, int] = GroupCommit()
    submitter = asyncio.create_task(group.submit("pool", 7, run))
    await asyncio.sleep(0.01)
    submitter.cancel()
    drained = asyncio.create_task(group.drain())
    await asyncio.sleep(0.01)
    assert not drained.done()
    release.set()
    await asyncio.wait_for(drained, 1)
    assert ran == [[7]]
