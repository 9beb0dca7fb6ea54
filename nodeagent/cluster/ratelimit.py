"""A token bucket: the kubelet's client-side limit on API writes (kubeAPIQPS / kubeAPIBurst).

A burst of ``burst`` requests goes out at once; after that, one every ``1/qps`` seconds. Waiters
are served in arrival order, so a flood of status writes cannot starve a pod deletion queued
behind it for long.
"""

from __future__ import annotations

import anyio

from nodeagent.clock import Clock, SystemClock


class TokenBucket:
    def __init__(self, qps: float, burst: int, clock: Clock | None = None) -> None:
        if qps <= 0 or burst < 1:
            raise ValueError("qps must be > 0 and burst >= 1")
        self.qps = qps
        self.burst = burst
        self._clock = clock or SystemClock()
        self._tokens = float(burst)
        self._stamp = self._clock.monotonic()
        self._lock = anyio.Lock()

    def _refill(self) -> None:
        now = self._clock.monotonic()
        self._tokens = min(float(self.burst), self._tokens + (now - self._stamp) * self.qps)
        self._stamp = now

    def try_acquire(self) -> bool:
        """Take a token if one is there, without waiting."""
        self._refill()
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False

    async def acquire(self) -> None:
        """Wait for a token (first come, first served)."""
        async with self._lock:
            while not self.try_acquire():
                await self._clock.sleep((1.0 - self._tokens) / self.qps)
