"""DRA drivers as the kubelet's DRA plugin handler takes them: the agent's plugin watcher
(nodeagent/pluginwatcher) finds a registration socket of type ``DRAPlugin`` and hands it to
:class:`DraRegistrations`, which checks it, connects to its endpoint with the newest DRA
service both sides speak, and keeps it in :class:`Drivers` until the watcher says it is gone.
"""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog

from nodeagent.events import Event
from nodeagent.pluginwatcher import PluginInfo
from plugins.dra import api
from plugins.dra.events import DraDriverDeregistered, DraDriverRegistered, DraPluginRejected

log = structlog.get_logger("nodeagent.dra")

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


class DraRegistrations:
    """The DRA stage's handler for plugins of type ``DRAPlugin`` (nodeagent.pluginwatcher finds
    them): the kubelet's DRA handler's checks, a client for the driver's endpoint, the drivers
    table the stage prepares claims through, and the stage's facts about it."""

    plugin_type = api.PLUGIN_TYPE

    def __init__(self, drivers: Drivers, publish: Callable[[Event], Awaitable[None]], *,
                 call_timeout: float = api.CALL_TIMEOUT_SECONDS, poll_seconds: float = 1.0,
                 health_seconds: float = 10.0) -> None:
        self.drivers = drivers
        self._publish = publish
        self.call_timeout = call_timeout
        self.poll_seconds = poll_seconds
        self.health_seconds = health_seconds
        """How often the agent's plugin watcher should look (it takes the fastest handler's)."""

    async def register(self, info: PluginInfo, socket: str) -> str:
        error = _validate(info)
        if not error:
            endpoint = info.endpoint or socket
            service = next(v for v in info.supported_versions if v in api.SERVICES)
            driver = Driver(info.name, endpoint, service, socket, api.DraClient(endpoint, service, self.call_timeout),
                            time.time())
            error = self.drivers.add(driver)
            if not error:
                log.info("DRA driver registered", driver=driver.name, endpoint=driver.endpoint,
                         service=driver.service, socket=socket)
                await self._publish(DraDriverRegistered(source="dra", driver=driver.name, endpoint=driver.endpoint,
                                                        service=driver.service, socket=socket))
                return ""
            await driver.client.close()
        await self._publish(DraPluginRejected(source="dra", socket=socket, plugin=info.name, message=error))
        return error

    async def deregister(self, socket: str, why: str) -> None:
        for driver in self.drivers.remove_socket(socket):
            log.info("DRA driver deregistered", driver=driver.name, socket=socket, why=why)
            await driver.client.close()
            await self._publish(DraDriverDeregistered(source="dra", driver=driver.name, endpoint=driver.endpoint,
                                                      socket=socket, why=why))


def _validate(info: PluginInfo) -> str:
    """The kubelet's checks and messages (the DRA handler's ValidatePlugin)."""
    if not info.name or len(info.name) > 253 or not _DNS_SUBDOMAIN.match(info.name):
        return f"invalid DRA driver name {info.name!r}: must be a DNS subdomain"
    if not info.supported_versions:
        return f"empty list for supported versions of DRA plugin {info.name}"
    if not any(v in api.SERVICES for v in info.supported_versions):
        return (f"none of services supported by the plugin ({list(info.supported_versions)}) are supported by "
                f"nodeagent ({list(api.SERVICES)})")
    return ""
