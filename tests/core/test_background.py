"""The end of an app's background tasks: cancelled and waited for, a death not silent."""

from __future__ import annotations

import asyncio

import pytest

from specroute.background import cancel_and_wait


async def test_every_task_is_cancelled_and_ended_before_it_returns() -> None:
    ended: list[str] = []

    async def forever(name: str) -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            await asyncio.sleep(0)  # a task may take a step to clean up
            ended.append(name)

    tasks = [asyncio.create_task(forever(n)) for n in ("health", "poll")]
    await asyncio.sleep(0)
    await cancel_and_wait(tasks)
    assert sorted(ended) == ["health", "poll"] and all(t.cancelled() for t in tasks)


async def test_a_task_already_ended_is_fine() -> None:
    async def quick() -> None:
        return None

    task = asyncio.create_task(quick())
    await task
    await cancel_and_wait([task])
    assert task.done() and not task.cancelled()


async def test_a_task_that_died_says_so() -> None:
    async def broken() -> None:
        raise RuntimeError("a bug in the loop")

    task = asyncio.create_task(broken())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="a bug in the loop"):
        await cancel_and_wait([task])


async def test_the_caller_is_not_left_cancelled() -> None:
    """The tasks' cancellation ends with them: the cleanup that called goes on."""
    task = asyncio.create_task(asyncio.sleep(3600))
    await cancel_and_wait([task])
    await asyncio.sleep(0)  # would raise CancelledError had it leaked to this task
    assert task.cancelled()
