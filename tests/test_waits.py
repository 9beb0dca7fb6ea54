"""nodeagent.waits.first_of: whichever wait ends first wins, the others are cancelled, and a
cancellation of the caller ends them all."""

from __future__ import annotations

import time

import anyio
import pytest

from nodeagent.waits import first_of

pytestmark = pytest.mark.anyio


async def _set_soon(event: anyio.Event) -> None:
    await anyio.sleep(0.01)
    event.set()


@pytest.mark.parametrize("position", [0, 1, 2])
async def test_the_wait_that_ends_first_wins_and_the_others_are_cancelled(position: int) -> None:
    event = anyio.Event()
    ended: list[int] = []

    async def sleeper(index: int) -> None:
        try:
            await anyio.sleep(30)
        finally:
            ended.append(index)

    waits = [sleeper(i) for i in range(3)]
    waits[position].close()
    waits[position] = event.wait()
    begin = time.monotonic()
    async with anyio.create_task_group() as tg:
        tg.start_soon(_set_soon, event)
        assert await first_of(*waits) == position
    assert time.monotonic() - begin < 10
    assert sorted(ended) == sorted(set(range(3)) - {position})  # cancelled, not left running


async def test_a_cancelled_caller_cancels_every_wait() -> None:
    begin = time.monotonic()
    with anyio.move_on_after(0.05) as scope:
        await first_of(anyio.sleep(30), anyio.sleep(30))
    assert scope.cancelled_caught and time.monotonic() - begin < 10


async def test_no_waits_is_no_winner() -> None:
    assert await first_of() == -1
