"""Time, injectable: stages and the core ask the clock, never ``time`` directly, so that
back-off and timeouts can be tested without sleeping."""

from __future__ import annotations

import time
from typing import Protocol

import anyio


class Clock(Protocol):
    def now(self) -> float:
        """Wall-clock seconds since the epoch (for timestamps people read)."""

    def monotonic(self) -> float:
        """Seconds on a monotonic scale (for durations and deadlines)."""

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(seconds)


class ManualClock:
    """A clock that moves only when a test advances it; sleepers wake when their time comes."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self._now = start
        self._wakeups: list[tuple[float, anyio.Event]] = []

    def now(self) -> float:
        return self._now

    def monotonic(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await anyio.lowlevel.checkpoint()
            return
        event = anyio.Event()
        self._wakeups.append((self._now + seconds, event))
        await event.wait()

    def advance(self, seconds: float) -> None:
        self._now += seconds
        due = [w for w in self._wakeups if w[0] <= self._now]
        self._wakeups = [w for w in self._wakeups if w[0] > self._now]
        for _, event in due:
            event.set()

    @property
    def sleepers(self) -> int:
        return len(self._wakeups)
