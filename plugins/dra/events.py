"""The facts the dra stage publishes (the kubelet logs most of these; some are its pod events,
e.g. FailedPrepareDynamicResources is our PodWaiting with that reason)."""

from __future__ import annotations

from typing import Literal

from nodeagent.events import Event


class DraDriverRegistered(Event):
    """A DRA driver answered GetInfo on a registration socket and was accepted (node-level)."""

    kind: Literal["DraDriverRegistered"] = "DraDriverRegistered"
    driver: str
    endpoint: str
    service: str
    """The DRA service version the agent speaks to it, e.g. ``v1.DRAPlugin``."""
    socket: str


class DraDriverDeregistered(Event):
    kind: Literal["DraDriverDeregistered"] = "DraDriverDeregistered"
    driver: str
    endpoint: str
    socket: str
    why: str
    """``socket removed``, ``socket replaced`` (the plugin restarted) or ``not answering``."""


class DraPluginRejected(Event):
    """A plugin registration socket that the agent cannot use; the plugin was told why."""

    kind: Literal["DraPluginRejected"] = "DraPluginRejected"
    socket: str
    plugin: str
    message: str


class DevicesPrepared(Event):
    """NodePrepareResources succeeded for the pod's claims of one driver (or they were adopted
    from the checkpoint after an agent restart)."""

    kind: Literal["DevicesPrepared"] = "DevicesPrepared"
    driver: str
    claims: list[str]
    """``namespace/name`` of each claim."""
    cdi_device_ids: list[str]
    adopted: bool = False


class DevicesUnprepared(Event):
    """NodeUnprepareResources succeeded: no pod on the node uses these claims any more."""

    kind: Literal["DevicesUnprepared"] = "DevicesUnprepared"
    driver: str
    claims: list[str]


class CdiEditsSkipped(Event):
    """CDI container edits that CRI cannot express (hooks, non-bind mounts, ...), so the agent
    could not apply them for a runtime that does not resolve CDI itself."""

    kind: Literal["CdiEditsSkipped"] = "CdiEditsSkipped"
    container: str
    edits: list[str]


class DraCheckpointDiscarded(Event):
    """The checkpoint of prepared claims was unreadable or failed its checksum; it was kept
    aside and the agent started without it (claims prepared before may leak)."""

    kind: Literal["DraCheckpointDiscarded"] = "DraCheckpointDiscarded"
    path: str
    message: str
