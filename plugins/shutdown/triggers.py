"""How the shutdown stage learns that the node is going down, and says it needs time.

* **systemd-logind** (where ``/run/systemd/system`` and the system bus exist): a *delay*
  inhibitor lock held for the stage's life (``systemd-inhibit --what=shutdown --who=kubelet
  --why="Kubelet needs time to handle node shutdown" --mode=delay``: logind waits up to its
  ``InhibitDelayMaxSec`` for the lock to go), and logind's ``PrepareForShutdown(bool)`` signal
  followed with ``gdbus monitor``; the lock is released once the pods are down and taken again
  on a cancellation. (The kubelet speaks D-Bus itself; these are the same calls through the
  tools systemd ships. It also raises ``InhibitDelayMaxSec`` in logind.conf.d; we do not: set
  it to at least the sum of the grace periods.)
* **a request file** everywhere else (containers, machines without systemd — these ones):
  ``nodeagent shutdown`` writes ``<rootDir>/<shutdownRequestFile>``, which the stage polls
  every half second; its removal (``nodeagent shutdown --cancel``) cancels. Only root can
  write there (rootDir is private), as only root can reach logind's signal.

Each yields True (shutting down) and False (cancelled) as they happen. The tools honour
``DBUS_SYSTEM_BUS_ADDRESS`` (tests point them at a stand-in logind: tests/fake_logind.py).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import anyio.abc
import structlog

log = structlog.get_logger("nodeagent.shutdown")

POLL_SECONDS = 0.5
RECONNECT_SECONDS = 1.0
WHY = "Kubelet needs time to handle node shutdown"


def logind_available() -> bool:
    return (Path("/run/systemd/system").is_dir() and Path("/run/dbus/system_bus_socket").exists()
            and shutil.which("gdbus") is not None and shutil.which("systemd-inhibit") is not None)


async def request_file_events(path: Path) -> AsyncIterator[bool]:
    """True when ``path`` appears, False when it goes (a cancellation)."""
    present = path.exists()
    if present:
        yield True
    while True:
        await anyio.sleep(POLL_SECONDS)
        now = path.exists()
        if now != present:
            present = now
            yield now


@asynccontextmanager
async def inhibitor_lock() -> AsyncIterator[anyio.abc.Process]:
    """A delay lock on shutdown, held while the context is open."""
    process = await anyio.open_process(["systemd-inhibit", "--what=shutdown", "--who=kubelet", f"--why={WHY}",
                                        "--mode=delay", "sleep", "infinity"])
    try:
        yield process
    finally:
        with anyio.CancelScope(shield=True):
            if process.returncode is None:
                process.terminate()
                with anyio.move_on_after(5):
                    await process.wait()


async def logind_events() -> AsyncIterator[bool]:
    """PrepareForShutdown(true|false) from logind, through ``gdbus monitor``; a lost bus is
    reconnected every second (the kubelet's dbusReconnectPeriod)."""
    while True:
        async for active in _monitor():
            yield active
        log.warning("lost the system bus; reconnecting", retry_in=RECONNECT_SECONDS)
        await anyio.sleep(RECONNECT_SECONDS)


async def _monitor() -> AsyncIterator[bool]:
    process = await anyio.open_process(["gdbus", "monitor", "--system", "--dest", "org.freedesktop.login1",
                                        "--object-path", "/org/freedesktop/login1"],
                                       env={**os.environ, "LC_ALL": "C"})
    try:
        assert process.stdout is not None
        buffer = b""
        async for chunk in process.stdout:
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                text = line.decode(errors="replace")
                if "PrepareForShutdown" in text:
                    yield "true" in text.split("PrepareForShutdown", 1)[1]
    finally:
        with anyio.CancelScope(shield=True):
            if process.returncode is None:
                process.terminate()
                with anyio.move_on_after(5):
                    await process.wait()


__all__ = ["inhibitor_lock", "logind_available", "logind_events", "request_file_events"]
