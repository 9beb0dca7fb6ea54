"""Exponential back-off for a loop that retries one thing: ``delay = initial * factor**n``,
capped at ``maximum``, optionally jittered, reset once the thing has worked for a while.

plugins/runtime/backoff.py is the kubelet's keyed back-off for container restarts and image
pulls (entries per key, forgotten after 2 x maximum); this one is for a single retry loop: a
supervised task, a watch that reconnects, a write that keeps failing.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class Backoff:
    initial: float = 1.0
    maximum: float = 60.0
    factor: float = 2.0
    jitter: float = 0.0
    """Up to this fraction is added at random (client-go's jitter), so that many agents
    retrying the same server do not do it in lock-step."""
    _next: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        self._next = self.initial

    def next(self) -> float:
        """The delay before the next attempt; each call grows the one after."""
        delay = self._next
        self._next = min(self._next * self.factor, self.maximum)
        if self.jitter:
            delay += delay * self.jitter * random.random()
        return delay

    def reset(self) -> None:
        """The retried thing worked: the next failure starts again at ``initial``."""
        self._next = self.initial

    @property
    def upcoming(self) -> float:
        """The delay the next call to :meth:`next` returns (without jitter)."""
        return self._next


__all__ = ["Backoff"]
