"""Back-off per key, the kubelet's way (client-go util/flowcontrol.Backoff, no jitter).

An entry starts at ``initial`` and doubles on every failure up to ``maximum``. It is forgotten
when the *failure being judged* happened more than 2 x ``maximum`` after the entry was last
updated (``hasExpired(eventTime, lastUpdate)``): a container that ran for ten minutes before it
crashed again starts over at ``initial``, while one that keeps crashing keeps its delay however
long it waits in back-off.

Times are plain floats on one scale chosen by the caller (the stage's clock), so tests can move
time with a manual clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class _Entry:
    delay: float
    last_update: float


@dataclass
class Backoff:
    initial: float
    maximum: float
    _entries: dict[str, _Entry] = field(default_factory=dict)

    def _expired(self, entry: _Entry, event_time: float) -> bool:
        return event_time - entry.last_update > 2 * self.maximum

    def next(self, key: str, event_time: float, now: float | None = None) -> float:
        """Record an attempt after the failure at ``event_time``, made at ``now`` (default: the
        event time, which is what the image puller records). Returns the delay that applies
        to the next failure."""
        now = event_time if now is None else now
        entry = self._entries.get(key)
        if entry is None or self._expired(entry, event_time):
            delay = self.initial
        else:
            delay = min(entry.delay * 2, self.maximum)
        self._entries[key] = _Entry(delay, now)
        return delay

    def remaining(self, key: str, event_time: float, now: float) -> float:
        """IsInBackOffSince: seconds still to wait after the failure at ``event_time``; 0 when
        there is no entry, the entry expired, or the delay has passed."""
        entry = self._entries.get(key)
        if entry is None or self._expired(entry, event_time):
            return 0.0
        return max(0.0, event_time + entry.delay - now)

    def current(self, key: str) -> float:
        entry = self._entries.get(key)
        return entry.delay if entry else 0.0

    def reset(self, key: str) -> None:
        self._entries.pop(key, None)
