"""Back-off per key, the kubelet's way (client-go flowcontrol.Backoff): start at ``initial``,
double on every failure up to ``maximum``, forget an entry not touched for 2 x ``maximum``."""

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

    def next(self, key: str, now: float) -> float:
        """Record a failure at ``now``; returns the delay before the next attempt."""
        entry = self._entries.get(key)
        if entry is None or now - entry.last_update > 2 * self.maximum:
            entry = _Entry(self.initial, now)
        else:
            entry = _Entry(min(entry.delay * 2, self.maximum), now)
        self._entries[key] = entry
        return entry.delay

    def remaining(self, key: str, since: float, now: float) -> float:
        """Seconds still to wait for ``key`` whose last failure happened at ``since``; 0 if none."""
        entry = self._entries.get(key)
        if entry is None or now - entry.last_update > 2 * self.maximum:
            return 0.0
        return max(0.0, since + entry.delay - now)

    def current(self, key: str) -> float:
        entry = self._entries.get(key)
        return entry.delay if entry else 0.0

    def reset(self, key: str) -> None:
        self._entries.pop(key, None)
