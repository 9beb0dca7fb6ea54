"""Kubelet plugin registration for DRA drivers: the plugins-registry directory is watched for
sockets; each one is asked who it is (GetInfo), accepted or refused, and told so
(NotifyRegistrationStatus), as the kubelet's pluginwatcher and DRA handler do.

Polling, not inotify: a stat of one directory per second is the kubelet's own reconcile
period, and it sees what inotify can miss (a directory re-created under us). A plugin that
restarts re-creates its socket (a new inode): the old registration is dropped and the new one
made. A registered plugin that stops answering GetInfo twice in a row is deregistered, as the
kubelet's connection monitor does; it registers again as soon as it answers.
"""

from __future__ import annotations

import os
import re
import stat
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import grpc
import structlog

from nodeagent.events import Event
from plugins.dra import api
from plugins.dra.events import DraDriverDeregistered, DraDriverRegistered, DraPluginRejected

log = structlog.get_logger("nodeagent.dra")

HEALTH_CHECK_SECONDS = 10.0  # the kubelet's connectionCheckInterval
MAX_FAILURES = 2  # the kubelet's maxFailures before a silent plugin is deregistered
RETRY_MAX_SECONDS = 30.0
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


@dataclass
class Driver:
    name: str
    endpoint: str
    service: str
    socket: str
    client: api.DraClient
    registered_at: float


class Drivers:
    """The registered DRA drivers. A driver may have several endpoints at once (a rolling
    update of its DaemonSet); the most recently registered one is used."""

    def __init__(self) -> None:
        self._by_name: dict[str, list[Driver]] = {}

    def get(self, name: str) -> Driver | None:
        found = self._by_name.get(name)
        return found[-1] if found else None

    def add(self, driver: Driver) -> str:
        """Register; returns an error message instead when the endpoint is taken."""
        existing = self._by_name.setdefault(driver.name, [])
        if any(d.endpoint == driver.endpoint for d in existing):
            return f"endpoint {driver.endpoint} already registered for DRA driver plugin {driver.name}"
        existing.append(driver)
        return ""

    def remove_socket(self, socket: str) -> list[Driver]:
        gone = []
        for name, drivers in list(self._by_name.items()):
            gone += [d for d in drivers if d.socket == socket]
            drivers[:] = [d for d in drivers if d.socket != socket]
            if not drivers:
                del self._by_name[name]
        return gone

    def all(self) -> list[Driver]:
        return [d for drivers in self._by_name.values() for d in drivers]


@dataclass
class _Socket:
    signature: tuple[int, int]
    """(inode, ctime): a plugin that restarts binds a new socket file."""
    driver: Driver | None = None
    error: str = ""
    next_attempt: float = 0.0
    delay: float = 0.0
    failures: int = 0


class PluginWatcher:
    def __init__(self, directory: Path, drivers: Drivers, publish: Callable[[Event], Awaitable[None]], *,
                 poll_seconds: float = 1.0, health_seconds: float = HEALTH_CHECK_SECONDS,
                 call_timeout: float = api.CALL_TIMEOUT_SECONDS) -> None:
        self.directory = directory
        self.drivers = drivers
        self._publish = publish
        self.poll_seconds = poll_seconds
        self.health_seconds = health_seconds
        self.call_timeout = call_timeout
        self._sockets: dict[str, _Socket] = {}

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Register what is there, report started, then keep watching."""
        await anyio.to_thread.run_sync(lambda: self.directory.mkdir(parents=True, exist_ok=True))
        await self.scan()
        task_status.started()
        last_health = time.monotonic()
        # Registered clients stay open when this task ends: the agent stops its node tasks
        # first, and pods being torn down (shielded) still need their drivers.
        while True:
            await anyio.sleep(self.poll_seconds)
            await self.scan()
            if time.monotonic() - last_health >= self.health_seconds:
                last_health = time.monotonic()
                await self.check_health()

    def describe(self) -> dict[str, Any]:
        return {
            "registryDir": str(self.directory),
            "drivers": [{"name": d.name, "endpoint": d.endpoint, "service": d.service, "socket": d.socket,
                         "registeredAt": d.registered_at} for d in self.drivers.all()],
            "refused": [{"socket": path, "error": s.error} for path, s in sorted(self._sockets.items())
                        if s.driver is None and s.error],
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
            if known.driver is None and now >= known.next_attempt:
                await self._register(path, known)

    async def check_health(self) -> None:
        """GetInfo on every registered socket; a plugin silent twice in a row is deregistered."""
        for path, sock in list(self._sockets.items()):
            if sock.driver is None:
                continue
            channel = grpc.aio.insecure_channel(api.target(path))
            try:
                await api.get_info(channel)
                sock.failures = 0
            except api.DriverCallError as exc:
                sock.failures += 1
                if sock.failures >= MAX_FAILURES:
                    await self._forget(path, f"not answering ({exc})")
                    sock.error = str(exc)
            finally:
                await channel.close()

    # --- one socket -----------------------------------------------------------------------

    async def _register(self, path: str, sock: _Socket) -> None:
        channel = grpc.aio.insecure_channel(api.target(path))
        try:
            try:
                info = await api.get_info(channel)
            except api.DriverCallError as exc:
                self._failed(path, sock, f"GetInfo failed: {exc}", notify=False)
                return
            error = _validate(info, path)
            driver: Driver | None = None
            if not error:
                endpoint = info.endpoint or path
                service = next(v for v in info.supported_versions if v in api.SERVICES)
                driver = Driver(info.name, endpoint, service, path, api.DraClient(endpoint, service, self.call_timeout),
                                time.time())
                error = self.drivers.add(driver)
                if error:
                    await driver.client.close()
                    driver = None
            if driver is None:
                self._failed(path, sock, error, notify=True)
                await _notify(channel, False, error, path)
                await self._publish(DraPluginRejected(source="dra", socket=path, plugin=info.name, message=error))
                return
            sock.driver, sock.error, sock.delay, sock.failures = driver, "", 0.0, 0
            log.info("DRA driver registered", driver=driver.name, endpoint=driver.endpoint, service=driver.service,
                     socket=path)
            await _notify(channel, True, "", path)
            await self._publish(DraDriverRegistered(source="dra", driver=driver.name, endpoint=driver.endpoint,
                                                    service=driver.service, socket=path))
        finally:
            await channel.close()

    def _failed(self, path: str, sock: _Socket, error: str, *, notify: bool) -> None:
        """Tried again later with back-off (the kubelet retries a failed registration from
        scratch); logged once per distinct error, not once per attempt."""
        if error != sock.error:
            log.warning("DRA plugin registration failed; will retry", socket=path, error=error)
        sock.error = error
        sock.delay = min(max(sock.delay * 2, self.poll_seconds), RETRY_MAX_SECONDS)
        sock.next_attempt = time.monotonic() + sock.delay

    async def _forget(self, path: str, why: str) -> None:
        sock = self._sockets.get(path)
        if sock is None:
            return
        for driver in self.drivers.remove_socket(path):
            log.info("DRA driver deregistered", driver=driver.name, socket=path, why=why)
            await driver.client.close()
            await self._publish(DraDriverDeregistered(source="dra", driver=driver.name, endpoint=driver.endpoint,
                                                      socket=path, why=why))
        sock.driver, sock.failures, sock.delay, sock.next_attempt = None, 0, 0.0, 0.0


def _validate(info: api.PluginInfo, path: str) -> str:
    """The kubelet's checks and messages (pluginwatcher, DRA handler's ValidatePlugin)."""
    if info.type != api.PLUGIN_TYPE:
        return f"RegisterPlugin error -- no handler registered for plugin type: {info.type} at socket {path}"
    if not info.name or len(info.name) > 253 or not _DNS_SUBDOMAIN.match(info.name):
        return f"invalid DRA driver name {info.name!r}: must be a DNS subdomain"
    if not info.supported_versions:
        return f"empty list for supported versions of DRA plugin {info.name}"
    if not any(v in api.SERVICES for v in info.supported_versions):
        return (f"none of services supported by the plugin ({list(info.supported_versions)}) are supported by "
                f"nodeagent ({list(api.SERVICES)})")
    return ""


async def _notify(channel: grpc.aio.Channel, registered: bool, error: str, path: str) -> None:
    try:
        await api.notify_registration_status(channel, registered, error)
    except api.DriverCallError as exc:  # the outcome stands; the plugin just did not hear it
        log.warning("NotifyRegistrationStatus failed", socket=path, error=str(exc))
