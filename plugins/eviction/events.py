"""The facts the eviction stage publishes (the kubelet's ``Warning Evicted`` Event on the pod)."""

from __future__ import annotations

from typing import Literal

from nodeagent.events import Event, KubeEvent


class PodEvicted(Event):
    """The node evicted the pod: under node pressure (``signal`` is the threshold's, e.g.
    ``memory.available``) or over a local storage limit (``emptydirfs.limit``,
    ``ephemeralpodfs.limit``, ``ephemeralcontainerfs.limit``). Its phase becomes Failed with
    reason Evicted and ``message``."""

    kind: Literal["PodEvicted"] = "PodEvicted"
    signal: str
    message: str
    """The kubelet's eviction message (``The node was low on resource: memory. ...``)."""
    grace_period_seconds: int

    def kube_event(self) -> KubeEvent:
        return KubeEvent("Warning", "Evicted", self.message)
