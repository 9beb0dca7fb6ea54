"""The accept loop of the agent's servers (the kubelet API, the local endpoint): a cap on
connections, and accept errors survived.

anyio's ``Listener.serve`` ends (raises) on the first accept error; out of file descriptors
(EMFILE, ENFILE) or buffers that would stop the kubelet API for good, and take the agent down
with it. Go's http.Server, which the kubelet uses, backs off instead (5 ms doubling to 1 s)
and keeps accepting: so do we.

At most ``limit`` connections are open at once. A connection starts *pending* (TLS
handshake, request head, authentication and authorization: a client that has not yet shown
who it is) and becomes *active* once its request is authorized. When the cap is reached:
the oldest pending connection is closed to make room (an idle or stalled client has had its
chance; a real client's handshake takes milliseconds, so it is not the oldest), or, when
every connection is active, the new one is closed at once. Both are counted. So idle
sockets, however many, cannot lock out the API server, and they cost at most ``limit``
connections' worth of memory.

Every connection also gets the kubelet server's 4 h Read/WriteTimeout as a hard deadline.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import anyio
import structlog
from anyio.abc import SocketListener, SocketStream, TaskGroup

log = structlog.get_logger("nodeagent.listener")

MAX_CONNECTIONS = 1024
CONNECTION_DEADLINE_SECONDS = 4 * 3600.0
"""The kubelet's ReadTimeout = WriteTimeout (4 h): no connection outlives it."""
ACCEPT_BACKOFF_MIN_SECONDS = 0.005
ACCEPT_BACKOFF_MAX_SECONDS = 1.0
ACCEPT_ERROR_LOG_EVERY_SECONDS = 10.0


@dataclass(eq=False)
class Slot:
    """One admitted connection."""

    scope: anyio.CancelScope
    active: bool = False
    closed: bool = False


@dataclass
class Counters:
    accepted: int = 0
    refused: int = 0
    """Closed at once: the cap was reached and every connection was active."""
    evicted: int = 0
    """Pending connections closed to make room for a new one."""
    accept_errors: int = 0


@dataclass
class ConnectionLimit:
    limit: int = MAX_CONNECTIONS
    deadline: float = CONNECTION_DEADLINE_SECONDS
    counters: Counters = field(default_factory=Counters)
    _pending: OrderedDict[Slot, None] = field(default_factory=OrderedDict)
    _active: set[Slot] = field(default_factory=set)

    @property
    def open(self) -> int:
        return len(self._pending) + len(self._active)

    def admit(self) -> Slot | None:
        if self.open >= self.limit:
            if not self._pending:
                self.counters.refused += 1
                return None
            oldest, _ = self._pending.popitem(last=False)
            oldest.closed = True
            oldest.scope.cancel()
            self.counters.evicted += 1
        slot = Slot(anyio.CancelScope(deadline=anyio.current_time() + self.deadline))
        self._pending[slot] = None
        self.counters.accepted += 1
        return slot

    def activate(self, slot: Slot) -> None:
        """The connection's request was authorized: it is no longer evictable."""
        if slot.closed or slot.active:
            return
        del self._pending[slot]
        slot.active = True
        self._active.add(slot)

    def release(self, slot: Slot) -> None:
        if slot.closed:
            return
        slot.closed = True
        if slot.active:
            self._active.discard(slot)
        else:
            self._pending.pop(slot, None)


async def _close(stream: SocketStream) -> None:
    with anyio.CancelScope(shield=True):
        try:
            await stream.aclose()
        except OSError:
            pass


async def accept_loop(listener: SocketListener, handler: Callable[[SocketStream, Slot], Awaitable[None]],
                      limit: ConnectionLimit, tg: TaskGroup) -> None:
    """Accept until cancelled, each admitted connection handled in ``tg``. A handler's
    exception is logged and ends only its own connection."""
    delay = 0.0
    last_logged = 0.0
    while True:
        try:
            raw = await listener.accept()
        except OSError as exc:
            # EMFILE, ENFILE, ENOBUFS, ENOMEM, ECONNABORTED...: the listener is fine, this
            # accept is not; Go's http.Server retries temporary errors the same way.
            limit.counters.accept_errors += 1
            delay = min(max(delay * 2, ACCEPT_BACKOFF_MIN_SECONDS), ACCEPT_BACKOFF_MAX_SECONDS)
            now = time.monotonic()
            if now - last_logged >= ACCEPT_ERROR_LOG_EVERY_SECONDS:
                last_logged = now
                log.error("accept failed; retrying", error=str(exc), retry_in=delay,
                          accept_errors=limit.counters.accept_errors, connections=limit.open)
            await anyio.sleep(delay)
            continue
        delay = 0.0
        slot = limit.admit()
        if slot is None:
            await _close(raw)
            continue
        tg.start_soon(_serve_one, raw, slot, handler, limit)


async def _serve_one(raw: SocketStream, slot: Slot, handler: Callable[[SocketStream, Slot], Awaitable[None]],
                     limit: ConnectionLimit) -> None:
    try:
        with slot.scope:
            await handler(raw, slot)
    except Exception:  # one connection must never take the listener (and the agent) down
        log.exception("connection failed")
    finally:
        limit.release(slot)
        await _close(raw)


__all__ = ["ConnectionLimit", "Counters", "Slot", "accept_loop"]
