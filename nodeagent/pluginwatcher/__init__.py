"""Kubelet plugin registration (the kubelet's pluginwatcher): one watcher of the plugins-registry
directory for the whole agent, handing each plugin to the stage that handles its type.

A driver (a DRA driver, a CSI driver, later a device plugin) announces itself by creating a
socket in ``pluginsRegistryDir`` that serves the registration API (pluginregistration v1). The
watcher asks it who it is (GetInfo), gives it to the handler registered for its ``type``
(``DRAPlugin``, ``CSIPlugin``; the stage that owns the type validates it and connects to its
endpoint), and tells the plugin the outcome (NotifyRegistrationStatus). A plugin of a type no
stage handles is refused with the kubelet's message. Stages never watch the directory
themselves: they offer handlers (``registration_handlers()``) and the agent runs this watcher.

Polling, not inotify: a stat of one directory per second is the kubelet's own reconcile
period, and it sees what inotify can miss (a directory re-created under us). A plugin that
restarts re-creates its socket (a new inode): the old registration is dropped and the new one
made. A registered plugin that stops answering GetInfo twice in a row is deregistered, as the
kubelet's connection monitor does; it registers again as soon as it answers. A refused or
failing socket is tried again with back-off (1 s doubling to 30 s), its error logged once.
"""

from __future__ import annotations

import asyncio
import os
import stat
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import anyio
import grpc
import structlog

from cri.grpcaio import caller_cancelled
from nodeagent.events import Event, PluginRejected
from nodeagent.pluginwatcher._generated import pluginregistration_v1_pb2, pluginregistration_v1_pb2_grpc

log = structlog.get_logger("nodeagent.pluginwatcher")

HEALTH_CHECK_SECONDS = 10.0  # the kubelet's connectionCheckInterval
MAX_FAILURES = 2  # the kubelet's maxFailures before a silent plugin is deregistered
RETRY_MAX_SECONDS = 30.0
GET_INFO_TIMEOUT_SECONDS = 1.0  # pluginwatcher: GetInfo
NOTIFY_TIMEOUT_SECONDS = 5.0  # pluginwatcher: notifyTimeoutDuration


@dataclass(frozen=True)
class PluginInfo:
    type: str
    name: str
    endpoint: str
    supported_versions: tuple[str, ...] = field(default_factory=tuple)


class RegistrationCallError(Exception):
    """GetInfo or NotifyRegistrationStatus failed as a whole (transport, deadline, the plugin's error)."""

    def __init__(self, method: str, error: grpc.aio.AioRpcError | grpc.aio.UsageError) -> None:
        if isinstance(error, grpc.aio.AioRpcError):
            code = error.code()
            super().__init__(f"{method}: {code.name if code else 'UNKNOWN'}: {error.details() or ''}".rstrip(": "))
        else:
            super().__init__(f"{method}: {error}")


class PluginHandler(Protocol):
    """What a stage offers for one plugin type (``registration_handlers()``)."""

    @property
    def plugin_type(self) -> str:
        """``DRAPlugin``, ``CSIPlugin``, ..."""

    async def register(self, info: PluginInfo, socket: str) -> str:
        """Validate and connect the plugin found at ``socket``; "" when it is registered, else
        the error the plugin is told (it is tried again later)."""

    async def deregister(self, socket: str, why: str) -> None:
        """The plugin at ``socket`` is gone (``socket removed``, ``socket replaced``,
        ``not answering (...)``): forget it; idempotent."""


def polling(handlers: Mapping[str, Any]) -> tuple[float, float]:
    """(poll, health check) seconds: the kubelet's 1 s and 10 s, or faster where a handler asks
    for it (its ``poll_seconds`` / ``health_seconds``, e.g. a test's tuning)."""
    poll = min([1.0, *(getattr(h, "poll_seconds", 1.0) for h in handlers.values())])
    health = min([HEALTH_CHECK_SECONDS,
                  *(getattr(h, "health_seconds", HEALTH_CHECK_SECONDS) for h in handlers.values())])
    return poll, health


_CLOSED = grpc.aio.UsageError("the call was cancelled: its channel was closed")


def target(socket_path: str) -> str:
    return f"unix:{socket_path}"


async def get_info(channel: grpc.aio.Channel, timeout: float = GET_INFO_TIMEOUT_SECONDS) -> PluginInfo:
    stub = pluginregistration_v1_pb2_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
    try:
        info = await stub.GetInfo(pluginregistration_v1_pb2.InfoRequest(), timeout=timeout)
    except (grpc.aio.AioRpcError, grpc.aio.UsageError) as exc:
        raise RegistrationCallError("GetInfo", exc) from None
    except asyncio.CancelledError:
        if await caller_cancelled():  # the scope's own (cri/grpcaio.py)
            raise
        raise RegistrationCallError("GetInfo", _CLOSED) from None
    return PluginInfo(info.type, info.name, info.endpoint, tuple(info.supported_versions))


async def notify_registration_status(channel: grpc.aio.Channel, registered: bool, error: str = "",
                                     timeout: float = NOTIFY_TIMEOUT_SECONDS) -> None:
    stub = pluginregistration_v1_pb2_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
    try:
        await stub.NotifyRegistrationStatus(
            pluginregistration_v1_pb2.RegistrationStatus(plugin_registered=registered, error=error), timeout=timeout)
    except (grpc.aio.AioRpcError, grpc.aio.UsageError) as exc:
        raise RegistrationCallError("NotifyRegistrationStatus", exc) from None
    except asyncio.CancelledError:
        if await caller_cancelled():  # the scope's own (cri/grpcaio.py)
            raise
        raise RegistrationCallError("NotifyRegistrationStatus", _CLOSED) from None


@dataclass
class _Socket:
    signature: tuple[int, int]
    """(inode, ctime): a plugin that restarts binds a new socket file."""
    handler: PluginHandler | None = None
    """The handler that registered it (None: not registered)."""
    name: str = ""
    error: str = ""
    next_attempt: float = 0.0
    delay: float = 0.0
    failures: int = 0


class PluginWatcher:
    def __init__(self, directory: Path, handlers: Mapping[str, PluginHandler],
                 publish: Callable[[Event], Awaitable[None]], *, poll_seconds: float = 1.0,
                 health_seconds: float = HEALTH_CHECK_SECONDS) -> None:
        self.directory = directory
        self.handlers = dict(handlers)
        self._publish = publish
        self.poll_seconds = poll_seconds
        self.health_seconds = health_seconds
        self._sockets: dict[str, _Socket] = {}

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Register what is there, report started, then keep watching."""
        await anyio.to_thread.run_sync(lambda: self.directory.mkdir(parents=True, exist_ok=True))
        await self.scan()
        task_status.started()
        last_health = time.monotonic()
        while True:
            await anyio.sleep(self.poll_seconds)
            await self.scan()
            if time.monotonic() - last_health >= self.health_seconds:
                last_health = time.monotonic()
                await self.check_health()

    def describe(self) -> dict[str, Any]:
        return {
            "registryDir": str(self.directory),
            "types": sorted(self.handlers),
            "registered": [{"socket": path, "plugin": s.name, "type": s.handler.plugin_type}
                           for path, s in sorted(self._sockets.items()) if s.handler is not None],
            "refused": [{"socket": path, "error": s.error} for path, s in sorted(self._sockets.items())
                        if s.handler is None and s.error],
        }

    # --- the directory --------------------------------------------------------------------

    def _list(self) -> dict[str, tuple[int, int]]:
        found: dict[str, tuple[int, int]] = {}
        try:
            entries = list(os.scandir(self.directory))
        except FileNotFoundError:
            return found
        for entry in entries:
            if entry.name.startswith("."):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISSOCK(st.st_mode):
                found[entry.path] = (st.st_ino, st.st_ctime_ns)
        return found

    async def scan(self) -> None:
        listing = await anyio.to_thread.run_sync(self._list)
        for path in sorted(set(self._sockets) - set(listing)):
            await self._forget(path, "socket removed")
            del self._sockets[path]
        now = time.monotonic()
        for path, signature in sorted(listing.items()):
            known = self._sockets.get(path)
            if known is not None and known.signature != signature:
                await self._forget(path, "socket replaced")
                known = None
            if known is None:
                known = self._sockets[path] = _Socket(signature)
            if known.handler is None and now >= known.next_attempt:
                await self._register(path, known)

    async def check_health(self) -> None:
        """GetInfo on every registered socket; a plugin silent twice in a row is deregistered."""
        for path, sock in list(self._sockets.items()):
            if sock.handler is None:
                continue
            channel = grpc.aio.insecure_channel(target(path))
            try:
                await get_info(channel)
                sock.failures = 0
            except RegistrationCallError as exc:
                sock.failures += 1
                if sock.failures >= MAX_FAILURES:
                    await self._forget(path, f"not answering ({exc})")
                    sock.error = str(exc)
            finally:
                await channel.close()

    # --- one socket -----------------------------------------------------------------------

    async def _register(self, path: str, sock: _Socket) -> None:
        channel = grpc.aio.insecure_channel(target(path))
        try:
            try:
                info = await get_info(channel)
            except RegistrationCallError as exc:
                self._failed(path, sock, f"GetInfo failed: {exc}")
                return
            handler = self.handlers.get(info.type)
            if handler is None:
                error = f"RegisterPlugin error -- no handler registered for plugin type: {info.type} at socket {path}"
                await self._publish(PluginRejected(source="core", socket=path, plugin=info.name, type=info.type,
                                                   message=error))
            else:
                error = await handler.register(info, path)
            if error:
                self._failed(path, sock, error)
                await _notify(channel, False, error, path)
                return
            assert handler is not None
            sock.handler, sock.name, sock.error, sock.delay, sock.failures = handler, info.name, "", 0.0, 0
            await _notify(channel, True, "", path)
        finally:
            await channel.close()

    def _failed(self, path: str, sock: _Socket, error: str) -> None:
        """Tried again later with back-off (the kubelet retries a failed registration from
        scratch); logged once per distinct error, not once per attempt."""
        if error != sock.error:
            log.warning("plugin registration failed; will retry", socket=path, error=error)
        sock.error = error
        sock.delay = min(max(sock.delay * 2, self.poll_seconds), RETRY_MAX_SECONDS)
        sock.next_attempt = time.monotonic() + sock.delay

    async def _forget(self, path: str, why: str) -> None:
        sock = self._sockets.get(path)
        if sock is None:
            return
        if sock.handler is not None:
            await sock.handler.deregister(path, why)
        sock.handler, sock.failures, sock.delay, sock.next_attempt = None, 0, 0.0, 0.0


async def _notify(channel: grpc.aio.Channel, registered: bool, error: str, path: str) -> None:
    try:
        await notify_registration_status(channel, registered, error)
    except RegistrationCallError as exc:  # the outcome stands; the plugin just did not hear it
        log.warning("NotifyRegistrationStatus failed", socket=path, error=str(exc))


__all__ = ["PluginHandler", "PluginInfo", "PluginRejected", "PluginWatcher", "RegistrationCallError", "polling",
           "get_info", "notify_registration_status", "target"]
