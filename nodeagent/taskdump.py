"""Every task's stack, on demand: what to ask of an agent that seems stuck.

``kill -USR1 <agent>`` writes every asyncio task's await chain (the coroutine it is in, then
the one that one awaits, down to the future it waits on) and every thread's stack to
``<rootDir>/debug/tasks-<UTC time>-<pid>.txt``, logs the path, and the agent carries on — Go's
goroutine dump, without the exit. A shutdown that overruns its bound writes one too, before the
agent gives up (nodeagent.agent.run_forever).

``asyncio.Task.get_stack()`` shows only the outermost frame of a suspended coroutine, which for
a task is its entry point (``_supervise``, ``run``): useless for telling where it waits. The
chain is walked here through ``cr_await`` / ``gi_yieldfrom`` / ``ag_await`` instead.
"""

from __future__ import annotations

import asyncio
import faulthandler
import linecache
import os
import time
from pathlib import Path
from types import FrameType
from typing import Any

DEBUG_DIR = "debug"
KEEP_DUMPS = 10
"""Dumps kept in the debug directory; older ones are removed, so a signal loop cannot fill the disk."""


def _frame_of(awaitable: Any) -> FrameType | None:
    for attribute in ("cr_frame", "gi_frame", "ag_frame"):
        frame = getattr(awaitable, attribute, None)
        if frame is not None:
            return frame  # type: ignore[no-any-return]
    return None


def _awaiting(awaitable: Any) -> Any:
    for attribute in ("cr_await", "gi_yieldfrom", "ag_await"):
        inner = getattr(awaitable, attribute, None)
        if inner is not None:
            return inner
    return None


def await_chain(coro: Any) -> list[str]:
    """The lines of one coroutine's await chain, outermost first, ending with what it waits on."""
    lines: list[str] = []
    current, seen = coro, 0
    while current is not None and seen < 200:  # a chain that long is a bug of its own
        seen += 1
        frame = _frame_of(current)
        if frame is not None:
            code, line = frame.f_code, frame.f_lineno  # None for a frame between two lines
            lines.append(f'  File "{code.co_filename}", line {line}, in {code.co_name}')
            source = linecache.getline(code.co_filename, line).strip() if line is not None else ""
            if source:
                lines.append(f"    {source}")
        inner = _awaiting(current)
        if inner is None and frame is None:
            # A future, or an object that does not tell what it awaits (an async generator's asend).
            text = repr(current)
            lines.append(f"  awaiting {text[:300]}")
        current = inner
    return lines


def render_tasks() -> str:
    """Every task of the running loop, sorted by name, each with its await chain."""
    tasks = sorted(asyncio.all_tasks(), key=lambda t: t.get_name())
    current = asyncio.current_task()
    out = [f"{len(tasks)} tasks"]
    for task in tasks:
        state = "done" if task.done() else "pending"
        mark = " (this dump)" if task is current else ""
        out.append("")
        out.append(f"task {task.get_name()!r} {state}{mark}")
        out.extend(await_chain(task.get_coro()))
    return "\n".join(out) + "\n"


def write_dump(root_dir: Path, why: str) -> Path:
    """Write the tasks' and threads' stacks under ``root_dir/debug``; returns the file's path."""
    directory = root_dir / DEBUG_DIR
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = directory / f"tasks-{stamp}-{os.getpid()}.txt"
    with open(path, "w", encoding="utf-8") as out:
        out.write(f"nodeagent task dump ({why}) at {stamp}, pid {os.getpid()}\n\n")
        out.write(render_tasks())
        out.write("\nthreads:\n")
        out.flush()
        faulthandler.dump_traceback(file=out, all_threads=True)
    for old in sorted(directory.glob("tasks-*.txt"))[:-KEEP_DUMPS]:
        old.unlink(missing_ok=True)
    return path


__all__ = ["DEBUG_DIR", "KEEP_DUMPS", "await_chain", "render_tasks", "write_dump"]
