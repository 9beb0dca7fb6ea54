"""Asking the API server about a request: the TokenReview and SubjectAccessReview webhooks'
common part, as the kubelet's delegating authenticator and authorizer have it.

- **Retry**: a review that fails for a reason that may pass (no answer, a timeout, 429, 5xx)
  is sent again with client-go's webhook back-off (500 ms × 1.5, jitter 0.2, 5 attempts);
  anything else fails the request at once.
- **Cache**: answers are reused for a TTL the caller chooses per answer (a TokenReview's
  success and failure both for ``cacheTTL``; a SubjectAccessReview's allow for
  ``cacheAuthorizedTTL``, deny for ``cacheUnauthorizedTTL``). Errors are never cached. The
  cache is bounded (least recently used entries go first), and concurrent misses for one key
  make one review (the kubelet's singleflight): 200 ``kubectl logs -f`` opened at once by one
  client cost one TokenReview, not 200.
"""

from __future__ import annotations

import random
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

import anyio
from lightkube import ApiError
from lightkube.core import generic_client

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
T = TypeVar("T")

RETRY_INITIAL_SECONDS = 0.5
RETRY_FACTOR = 1.5
RETRY_JITTER = 0.2
RETRY_STEPS = 5
ATTEMPT_TIMEOUT_SECONDS = 10.0
"""One review that takes longer than this is given up and, like a lost answer, retried."""
CACHE_ENTRIES = 8192
# No answer at all: the transport errors of whichever httpx lightkube is built on.
_TRANSPORT_ERROR: type[BaseException] = getattr(generic_client, "httpx").TransportError  # noqa: B009


def transient(exc: BaseException) -> bool:
    """client-go's webhook DefaultShouldRetry: no answer, or an answer that says "later"."""
    if isinstance(exc, ApiError):
        return exc.status.code == 429 or (exc.status.code or 0) >= 500
    return isinstance(exc, (_TRANSPORT_ERROR, TimeoutError, OSError))


async def with_retry(call: Callable[[], Awaitable[T]], *, sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
                     attempt_timeout: float = ATTEMPT_TIMEOUT_SECONDS) -> T:
    delay = RETRY_INITIAL_SECONDS
    for attempt in range(1, RETRY_STEPS + 1):
        try:
            with anyio.fail_after(attempt_timeout):
                return await call()
        except Exception as exc:
            if attempt == RETRY_STEPS or not transient(exc):
                raise
        await sleep(delay * (1 + random.random() * RETRY_JITTER))
        delay *= RETRY_FACTOR
    raise AssertionError("unreachable")


@dataclass
class _Entry(Generic[V]):
    value: V
    expires: float


class _Flight:
    def __init__(self) -> None:
        self.done = anyio.Event()


class ReviewCache(Generic[K, V]):
    """Answers by key, each kept for the TTL its fetch returned (0: not kept)."""

    def __init__(self, *, entries: int = CACHE_ENTRIES, clock: Callable[[], float] = time.monotonic) -> None:
        self._entries: OrderedDict[K, _Entry[V]] = OrderedDict()
        self._flights: dict[K, _Flight] = {}
        self._max = entries
        self._clock = clock
        self.hits = 0
        self.misses = 0

    def _cached(self, key: K) -> _Entry[V] | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry.expires <= self._clock():
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return entry

    async def get(self, key: K, fetch: Callable[[], Awaitable[tuple[V, float]]]) -> V:
        """The cached answer, or ``fetch()``'s (value, ttl). While one fetch for ``key`` runs,
        other callers wait for it; if it fails they try themselves (errors are not shared, as
        they are not cached: the next caller may have better luck)."""
        while True:
            entry = self._cached(key)
            if entry is not None:
                self.hits += 1
                return entry.value
            flight = self._flights.get(key)
            if flight is None:
                break
            await flight.done.wait()
        flight = self._flights[key] = _Flight()
        self.misses += 1
        try:
            value, ttl = await fetch()
            if ttl > 0:
                self._entries[key] = _Entry(value, self._clock() + ttl)
                self._entries.move_to_end(key)
                while len(self._entries) > self._max:
                    self._entries.popitem(last=False)
            return value
        finally:
            del self._flights[key]
            flight.done.set()

    def __len__(self) -> int:
        return len(self._entries)


__all__ = ["ReviewCache", "transient", "with_retry"]
