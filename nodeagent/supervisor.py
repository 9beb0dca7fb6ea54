"""The supervisor: every long-running task of the agent runs under it, so that nothing but a
signal stops the agent.

A task that raises is not allowed to take the task group (and with it the agent and the
management of every pod) down. Its failure is

* logged — with the traceback the first time and whenever the error changes, one line for a
  repeat, so a crash loop does not flood the log;
* counted — ``nodeagent_task_failures_total{task}``;
* reported — a :class:`~nodeagent.events.TaskFailed` fact on the bus (cluster mode turns it
  into a Warning Event on the Node); offered, never awaited, since the failing task may be a
  bus subscriber whose own queue is full;

and the task is started again after a back-off (1 s doubling to 60 s, jittered; a task that
ran for a minute before failing starts again at 1 s). Pods keep running meanwhile: their
workers do not depend on any one of these tasks being up.

Failures that a caller contains itself — one request of a server, one fact of a subscriber —
are reported the same way through :meth:`Supervisor.contain`, without a restart.

A task that fails before it reported itself started (``task_status.started()``) does not hold
up the agent's start: :meth:`Supervisor.start` returns ``None`` for it and the task keeps
being retried in the background. Cancellation is never caught: the agent stopping stops every
task at once. A stray ``CancelledError`` (one no cancellation of the task asked for) is a
failure, not a cancellation (:func:`failing_stray_cancellations`).
"""

from __future__ import annotations

import asyncio
import traceback
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, Generic, TypeVar

import anyio
import structlog
from anyio.abc import TaskGroup, TaskStatus

from nodeagent import events as ev
from nodeagent.backoff import Backoff
from nodeagent.clock import Clock, SystemClock

log = structlog.get_logger("nodeagent.supervisor")


class StrayCancellation(Exception):
    """A ``CancelledError`` that no cancellation of this task asked for: library code raised it
    (grpc.aio's bare one, a future another task cancelled). Left to travel, it ends its task and,
    reaching a task group, cancels every task in it without a word (anyio takes it for the
    group's own cancellation). At task boundaries it is turned into this failure instead."""


@contextmanager
def failing_stray_cancellations() -> Iterator[None]:
    """Around a task's body: a stray ``CancelledError`` (this task's cancel count is 0, so no
    scope or task group cancelled it) becomes a :class:`StrayCancellation`; a real
    cancellation passes."""
    try:
        yield
    except asyncio.CancelledError as exc:
        task = asyncio.current_task()
        if task is None or task.cancelling() > 0:
            raise
        raise StrayCancellation(f"a CancelledError that no cancellation asked for ({exc!r})") from exc


STABLE_SECONDS = 60.0
"""A task that ran this long before it failed starts its back-off again at the beginning."""

T = TypeVar("T")


def restart_backoff() -> Backoff:
    return Backoff(initial=1.0, maximum=60.0, jitter=0.1)


class _FirstStart(Generic[T]):
    """The task_status a supervised task gets: the first ``started`` reaches whoever awaits
    :meth:`Supervisor.start`; later ones (after a restart) go nowhere."""

    def __init__(self, outer: TaskStatus[T | None]) -> None:
        self._outer: TaskStatus[T | None] | None = outer

    def started(self, value: T | None = None) -> None:
        if self._outer is not None:
            outer, self._outer = self._outer, None
            outer.started(value)

    def release(self) -> None:
        """The task cannot report started now (it failed first): let the starter go on."""
        self.started(None)


class Supervisor:
    def __init__(self, task_group: TaskGroup, *, offer: Callable[[ev.Event], int] | None = None,
                 clock: Clock | None = None, backoff: Callable[[], Backoff] = restart_backoff) -> None:
        self._tg = task_group
        self._offer = offer
        self._clock = clock or SystemClock()
        self._backoff = backoff
        self.failures: dict[str, int] = {}
        """Task name → failures since the agent started (nodeagent_task_failures_total)."""
        self._last_error: dict[str, str] = {}

    # --- starting tasks ----------------------------------------------------------------

    async def start(self, func: Callable[..., Awaitable[Any]], *args: Any, name: str) -> Any:
        """Like ``TaskGroup.start``: ``func`` takes ``task_status``; returns what it reported
        started with (None if it failed before it could)."""
        return await self._tg.start(self._supervise, func, args, name, True, name=name)

    def start_soon(self, func: Callable[..., Awaitable[Any]], *args: Any, name: str) -> None:
        """Like ``TaskGroup.start_soon``, supervised."""
        self._tg.start_soon(self._supervise, func, args, name, False, name=name)

    async def _supervise(self, func: Callable[..., Awaitable[Any]], args: tuple[Any, ...], name: str,
                         reports_started: bool, *,
                         task_status: TaskStatus[Any] = anyio.TASK_STATUS_IGNORED) -> None:
        backoff = self._backoff()
        first = _FirstStart[Any](task_status)
        while True:
            began = self._clock.monotonic()
            try:
                with failing_stray_cancellations():
                    if reports_started:
                        await func(*args, task_status=first)
                    else:
                        first.release()
                        await func(*args)
            except Exception as exc:  # noqa: BLE001 - the point of a supervisor
                if self._clock.monotonic() - began >= STABLE_SECONDS:
                    backoff.reset()
                delay = backoff.next()
                self._report(name, exc, restart_in=delay)
                first.release()
                await self._clock.sleep(delay)
                continue
            first.release()
            log.debug("task ended", task=name)
            return

    # --- failures contained elsewhere ----------------------------------------------------

    def contain(self, name: str, exc: Exception) -> None:
        """A failure its caller contained (one request, one fact): reported, nothing restarted."""
        self._report(name, exc, restart_in=None)

    @contextmanager
    def containing(self, name: str) -> Iterator[None]:
        """``with supervisor.containing("trace"): handle(event)`` — an exception in the block is
        reported and swallowed; cancellation passes."""
        try:
            yield
        except Exception as exc:  # noqa: BLE001
            self.contain(name, exc)

    def _report(self, name: str, exc: BaseException, restart_in: float | None) -> None:
        count = self.failures.get(name, 0) + 1
        self.failures[name] = count
        error = f"{type(exc).__name__}: {exc}"
        fields: dict[str, Any] = {"task": name, "error": error, "failures": count}
        if restart_in is not None:
            fields["restart_in"] = round(restart_in, 3)
        message = "task failed; restarting it" if restart_in is not None else "task failed; contained"
        if self._last_error.get(name) != error:
            self._last_error[name] = error
            fields["traceback"] = "".join(traceback.format_exception(exc)).rstrip()
        log.error(message, **fields)
        if self._offer is not None:
            try:
                self._offer(ev.TaskFailed(source="supervisor", task=name, error=error, failures=count,
                                          restart_in_seconds=restart_in))
            except Exception:  # noqa: BLE001 - reporting must never be what fails
                log.exception("could not publish the task failure", task=name)

    def render_metrics(self) -> str:
        lines = ["# HELP nodeagent_task_failures_total Failures of the agent's long-running tasks, by task.",
                 "# TYPE nodeagent_task_failures_total counter"]
        for task, count in sorted(self.failures.items()):
            lines.append(f'nodeagent_task_failures_total{{task="{task}"}} {count}')
        return "\n".join(lines) + "\n"


__all__ = ["Supervisor", "STABLE_SECONDS", "StrayCancellation", "failing_stray_cancellations", "restart_backoff"]
