"""Waiting for whichever of several things happens first — the other waits are cancelled.

``await first_of(event.wait(), clock.sleep(30))`` is the shape of "the pod changed, or the
resync period passed"; it returns the index of the one that finished (the earliest in the
argument list if several finish in the same pass). Cancellation of the caller cancels them all.
"""

from __future__ import annotations

from collections.abc import Awaitable

import anyio


async def first_of(*waits: Awaitable[object]) -> int:
    winner: list[int] = []
    async with anyio.create_task_group() as tg:
        async def run(index: int, wait: Awaitable[object]) -> None:
            await wait
            if not winner:
                winner.append(index)
                tg.cancel_scope.cancel()

        for index, wait in enumerate(waits[1:], start=1):
            tg.start_soon(run, index, wait)
        # The first wait in this task, inside the group's scope (a task fewer per call: the
        # stages wait this way at every change of every pod). Another finishing first cancels
        # it with the group; the group's exit absorbs that cancellation, not the caller's.
        if waits:
            await run(0, waits[0])
    return winner[0] if winner else -1


__all__ = ["first_of"]
