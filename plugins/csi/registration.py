"""CSI drivers as the kubelet's CSI plugin handler takes them (pkg/volume/csi/csi_plugin.go
RegistrationHandler): the agent's plugin watcher (nodeagent/pluginwatcher) finds a
registration socket of type ``CSIPlugin`` and hands it to :class:`CsiRegistrations`, which

1. checks the versions it supports (the highest parseable one must be a 1.x; 2.x and later are
   ignored, 0.x is refused), and refuses a second driver of the same name unless its highest
   version is strictly higher (then it replaces the first);
2. connects to its endpoint and asks NodeGetInfo (the node ID, max volumes, topology);
3. installs it in the node's CSINode and on the Node (plugins/csi/nodeinfo.py; cluster mode);
   a failure of 2 or 3 refuses the registration, which the watcher tries again.

Deregistration (socket removed or replaced, plugin silent) uninstalls it again. The messages
are the kubelet's (``kubernetes.io/csi: ...``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog

from nodeagent.events import Event
from nodeagent.pluginwatcher import PluginInfo
from plugins.csi import api
from plugins.csi.events import (
    CsiDriverDeregistered,
    CsiDriverRegistered,
    CsiPluginRejected,
)
from plugins.csi.nodeinfo import NodeInfoError, NodeInfoManager

log = structlog.get_logger("nodeagent.csi")

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
REGISTRATION_TIMEOUT_SECONDS = 10.0
"""NodeGetInfo during registration (the kubelet allows csiTimeout, 2 min, in its own goroutine;
the agent's one watcher would wait for every other plugin meanwhile)."""


def _log(message: str) -> str:
    return f"kubernetes.io/csi: {message}"


@dataclass
class Driver:
    name: str
    endpoint: str
    socket: str
    version: tuple[int, ...]
    node_id: str
    client: api.CsiClient
    registered_at: float

    @property
    def version_text(self) -> str:
        return ".".join(str(p) for p in self.version)


class Drivers:
    """The registered CSI drivers by name (one endpoint per name, as in the kubelet)."""

    def __init__(self) -> None:
        self._by_name: dict[str, Driver] = {}

    def get(self, name: str) -> Driver | None:
        return self._by_name.get(name)

    def all(self) -> list[Driver]:
        return list(self._by_name.values())

    def set(self, driver: Driver) -> Driver | None:
        """Register; returns the driver it replaced."""
        old = self._by_name.get(driver.name)
        self._by_name[driver.name] = driver
        return old

    def remove_socket(self, socket: str) -> list[Driver]:
        gone = [d for d in self._by_name.values() if d.socket == socket]
        for driver in gone:
            del self._by_name[driver.name]
        return gone


class CsiRegistrations:
    """The csi stage's handler for plugins of type ``CSIPlugin``."""

    plugin_type = api.PLUGIN_TYPE

    def __init__(self, drivers: Drivers, nodeinfo: NodeInfoManager | None,
                 publish: Callable[[Event], Awaitable[None]], *, call_timeout: float = api.CALL_TIMEOUT_SECONDS,
                 registration_timeout: float = REGISTRATION_TIMEOUT_SECONDS,
                 on_change: Callable[[], None] | None = None) -> None:
        self.drivers = drivers
        self.nodeinfo = nodeinfo
        """None standalone: no CSINode, no Node to annotate."""
        self._publish = publish
        self.call_timeout = call_timeout
        self.registration_timeout = registration_timeout
        self._on_change = on_change or (lambda: None)

    async def register(self, info: PluginInfo, socket: str) -> str:
        error, version = self._validate(info)
        if error:
            await self._reject(info, socket, error)
            return error
        assert version is not None
        endpoint = info.endpoint or socket
        client = api.CsiClient(endpoint, self.call_timeout)
        try:
            node = await client.node_info(timeout=self.registration_timeout)
            if self.nodeinfo is not None:
                await self.nodeinfo.install(info.name, node.node_id, node.max_volumes_per_node, node.topology)
        except (api.CsiCallError, NodeInfoError, OSError) as exc:
            await client.close()
            error = f"{exc}" if isinstance(exc, NodeInfoError) else _log(f"NodeGetInfo failed: {exc}")
            await self._reject(info, socket, error)
            return error
        driver = Driver(info.name, endpoint, socket, version, node.node_id, client, time.time())
        replaced = self.drivers.set(driver)
        if replaced is not None:
            await replaced.client.close()
        log.info("CSI driver registered", driver=driver.name, endpoint=endpoint, version=driver.version_text,
                 node_id=node.node_id, topology=dict(node.topology), socket=socket)
        await self._publish(CsiDriverRegistered(source="csi", driver=driver.name, endpoint=endpoint, socket=socket,
                                                version=driver.version_text, node_id=node.node_id))
        self._on_change()
        return ""

    async def deregister(self, socket: str, why: str) -> None:
        for driver in self.drivers.remove_socket(socket):
            log.info("CSI driver deregistered", driver=driver.name, socket=socket, why=why)
            await driver.client.close()
            if self.nodeinfo is not None:
                try:
                    await self.nodeinfo.uninstall(driver.name)
                except NodeInfoError as exc:  # the next registration of the driver writes it again
                    log.warning("CSI driver not uninstalled from the CSINode", driver=driver.name, error=str(exc))
            await self._publish(CsiDriverDeregistered(source="csi", driver=driver.name, endpoint=driver.endpoint,
                                                      socket=socket, why=why))
            self._on_change()

    def _validate(self, info: PluginInfo) -> tuple[str, tuple[int, ...] | None]:
        """The kubelet's validateVersions (and a name check of ours: the name becomes a path)."""
        if not info.name or len(info.name) > 253 or not _DNS_SUBDOMAIN.match(info.name):
            return f"invalid CSI driver name {info.name!r}: must be a DNS subdomain", None
        versions = list(info.supported_versions)
        if not versions:
            return _log(f"RegisterPlugin for CSI driver {info.name!r} failed. Plugin returned an empty list for "
                        "supported versions"), None
        highest = api.highest_supported_version(versions)
        if highest is None:
            return _log(f"RegisterPlugin for CSI driver {info.name!r} failed. None of the versions specified "
                        f"{versions!r} are supported."), None
        existing = self.drivers.get(info.name)
        if existing is not None and not existing.version < highest:
            return _log(f"RegisterPlugin for CSI driver {info.name!r} failed. Another driver with the same name is "
                        f"already registered with a higher supported version: {existing.version_text!r}"), None
        return "", highest

    async def _reject(self, info: PluginInfo, socket: str, error: str) -> None:
        await self._publish(CsiPluginRejected(source="csi", socket=socket, plugin=info.name, message=error))


__all__ = ["CsiRegistrations", "Driver", "Drivers"]
