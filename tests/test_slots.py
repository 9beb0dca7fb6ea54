"""nodeagent.slots.PrioritySlots: one bound for prepare and start, starts served first, and no
slot lost to a cancelled waiter."""

from __future__ import annotations

import anyio
import pytest

from nodeagent.slots import PrioritySlots, Turn

pytestmark = pytest.mark.anyio


async def test_a_freed_slot_goes_to_a_waiting_start_before_earlier_waiting_prepares() -> None:
    slots = PrioritySlots(2)
    served: list[str] = []
    release = anyio.Event()

    async def holder() -> None:
        async with slots.hold(Turn.THEN):
            await release.wait()

    async def waiter(name: str, turn: Turn) -> None:
        async with slots.hold(turn):
            served.append(name)

    async with anyio.create_task_group() as tg:
        tg.start_soon(holder)
        tg.start_soon(holder)
        await anyio.wait_all_tasks_blocked()
        assert slots.in_use == 2
        for name in ("prepare-1", "prepare-2"):
            tg.start_soon(waiter, name, Turn.THEN)
            await anyio.wait_all_tasks_blocked()
        tg.start_soon(waiter, "start", Turn.FIRST)
        await anyio.wait_all_tasks_blocked()
        assert (slots.waiting(Turn.FIRST), slots.waiting(Turn.THEN)) == (1, 2)
        release.set()
    assert served == ["start", "prepare-1", "prepare-2"]
    assert slots.in_use == 0


async def test_never_more_holders_than_slots() -> None:
    slots = PrioritySlots(3)
    inside, most = 0, 0

    async def work(turn: Turn) -> None:
        nonlocal inside, most
        async with slots.hold(turn):
            inside += 1
            most = max(most, inside)
            await anyio.sleep(0.001)
            inside -= 1

    async with anyio.create_task_group() as tg:
        for i in range(40):
            tg.start_soon(work, Turn(i % 2))
    assert most == 3 and slots.in_use == 0


async def test_a_waiter_cancelled_while_waiting_or_just_handed_a_slot_loses_no_slot() -> None:
    slots = PrioritySlots(1)
    got: list[str] = []
    held = slots.hold(Turn.FIRST)
    await held.__aenter__()
    with anyio.CancelScope() as gone:
        gone.cancel()
        async with slots.hold(Turn.THEN):
            got.append("cancelled before waiting")
    assert slots.waiting(Turn.THEN) == 0 and slots.in_use == 1

    async with anyio.create_task_group() as tg:
        scopes = [anyio.CancelScope(), anyio.CancelScope()]

        async def waiter(scope: anyio.CancelScope, name: str) -> None:
            with scope:
                async with slots.hold(Turn.THEN):
                    got.append(name)

        tg.start_soon(waiter, scopes[0], "cancelled while waiting")
        tg.start_soon(waiter, scopes[1], "cancelled once handed the slot")
        await anyio.wait_all_tasks_blocked()
        assert slots.waiting(Turn.THEN) == 2
        scopes[0].cancel()
        await anyio.wait_all_tasks_blocked()
        assert slots.waiting(Turn.THEN) == 1
        # The holder's release hands the slot to the waiter, which is cancelled in the same
        # pass before it ran: whether it still runs its body (asyncio lets a task whose wait
        # already ended run to its next checkpoint) or not, the slot must come back.
        await held.__aexit__(None, None, None)
        scopes[1].cancel()
    assert slots.in_use == 0 and slots.waiting(Turn.THEN) == 0
    async with slots.hold(Turn.THEN):
        got.append("after")
    assert "cancelled before waiting" not in got and "cancelled while waiting" not in got
    assert got[-1] == "after"


def test_at_least_one_slot() -> None:
    with pytest.raises(ValueError):
        PrioritySlots(0)
