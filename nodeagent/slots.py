"""A fixed number of slots, handed to the waiters of the first class before any of the second:
the pods in prepare or start at once, with a prepared pod's start served before the next pod's
prepare.

Why not one FIFO limiter, or one per phase: with one FIFO limiter for both phases a prepared
pod's start queued behind every pod still waiting to prepare (at 110 pods, Starting → Running
took 10 s p50); with a limiter per phase up to twice as many pods were in the runtime at once,
for no faster start (benchmarks/RESULTS.md, 2026-12-04). Here the bound stays one number and a
start never waits behind a prepare.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from enum import IntEnum

import anyio
import anyio.lowlevel


class Turn(IntEnum):
    """Who is served first when a slot frees: lower first."""

    FIRST = 0
    THEN = 1


class PrioritySlots:
    def __init__(self, total: int) -> None:
        if total < 1:
            raise ValueError(f"slots must be at least 1, not {total}")
        self.total = total
        self._in_use = 0
        self._waiting: tuple[deque[anyio.Event], ...] = tuple(deque() for _ in Turn)

    @property
    def in_use(self) -> int:
        return self._in_use

    def waiting(self, turn: Turn) -> int:
        return len(self._waiting[turn])

    @asynccontextmanager
    async def hold(self, turn: Turn) -> AsyncIterator[None]:
        await self._acquire(turn)
        try:
            yield
        finally:
            self._release()

    async def _acquire(self, turn: Turn) -> None:
        await anyio.lowlevel.checkpoint_if_cancelled()
        # A free slot goes to whoever asks only when nobody waits: a later arrival of either
        # class never takes a slot from a waiter it was handed to.
        if self._in_use < self.total and not any(self._waiting):
            self._in_use += 1
            await anyio.lowlevel.cancel_shielded_checkpoint()
            return
        handed = anyio.Event()
        queue = self._waiting[turn]
        queue.append(handed)
        try:
            await handed.wait()
        except BaseException:
            if handed.is_set():
                self._release()  # handed a slot while being cancelled: the next waiter's
            else:
                queue.remove(handed)
            raise

    def _release(self) -> None:
        for queue in self._waiting:
            if queue:
                queue.popleft().set()  # handed over: still in use, by the waiter now
                return
        self._in_use -= 1


__all__ = ["PrioritySlots", "Turn"]
