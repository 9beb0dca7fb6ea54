"""Fault and latency injection, and the call log, of the memory runtime.

Every CRI call the runtime serves is recorded (:class:`Call`: method, request, the pod it concerns
when the runtime can tell, gRPC code, when) and checked against the armed :class:`Fault`\\ s. A
fault names a method (``"*"``: any), optionally a pod UID and a predicate on the request, and either
fails the call with a gRPC status or delays it — *before* the runtime acts (a cancelled caller then
leaves nothing done) or *after* (the work is done; a caller cancelled meanwhile never sees the
answer, which is what a client-side timeout does to a sandbox containerd did create).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
import grpc


@dataclass
class Call:
    method: str
    request: Any
    pod: str
    """The pod UID the call concerns ("" when the runtime cannot tell: images, unfiltered lists)."""
    at: float = field(default_factory=time.time)
    code: grpc.StatusCode = grpc.StatusCode.OK
    cancelled: bool = False
    """The caller went away before the answer (a client-side cancellation or deadline)."""


@dataclass
class Fault:
    method: str
    code: grpc.StatusCode | None = None
    message: str = ""
    delay: float = 0.0
    when: Literal["before", "after"] = "before"
    pod: str | None = None
    match: Callable[[Any], bool] | None = None
    times: int | None = 1
    """How many calls it applies to (None: until disarmed)."""
    hits: int = 0
    reached: anyio.Event = field(default_factory=anyio.Event)
    """Set when a call first met this fault (a delay: when the runtime starts holding it)."""

    def applies(self, call: Call, when: str) -> bool:
        if self.when != when or self.method not in ("*", call.method):
            return False
        if self.pod is not None and self.pod != call.pod:
            return False
        if self.match is not None and not self.match(call.request):
            return False
        return self.times is None or self.hits < self.times


class Faults:
    def __init__(self) -> None:
        self._armed: list[Fault] = []
        self.log: list[Call] = []

    def fail(self, method: str, code: grpc.StatusCode, message: str = "", *, times: int | None = 1,
             pod: str | None = None, match: Callable[[Any], bool] | None = None,
             when: Literal["before", "after"] = "before") -> Fault:
        """Fail the next ``times`` calls of ``method`` with ``code`` (``when="after"``: once the
        runtime has done the work, as a runtime that acted and then lost the connection)."""
        fault = Fault(method, code, message or f"injected failure of {method}", when=when, pod=pod, match=match,
                      times=times)
        self._armed.append(fault)
        return fault

    def delay(self, method: str, seconds: float, *, times: int | None = None, pod: str | None = None,
              match: Callable[[Any], bool] | None = None, when: Literal["before", "after"] = "before") -> Fault:
        """Hold calls of ``method`` ``seconds`` before (or after) the runtime acts."""
        fault = Fault(method, delay=seconds, when=when, pod=pod, match=match, times=times)
        self._armed.append(fault)
        return fault

    def disarm(self, fault: Fault | None = None) -> None:
        """Disarm ``fault``, or every fault."""
        self._armed = [] if fault is None else [f for f in self._armed if f is not fault]

    async def apply(self, call: Call, when: Literal["before", "after"], context: Any) -> None:
        for fault in list(self._armed):
            if not fault.applies(call, when):
                continue
            fault.hits += 1
            fault.reached.set()
            if fault.delay:
                await anyio.sleep(fault.delay)
            if fault.code is not None:
                call.code = fault.code
                await context.abort(fault.code, fault.message)

    def calls(self, method: str | None = None, pod: str | None = None) -> list[Call]:
        return [c for c in self.log if (method is None or c.method == method) and (pod is None or c.pod == pod)]


__all__ = ["Call", "Fault", "Faults"]
