"""Kinds of API objects a stage can ask the object store for.

A :class:`Kind` names an API resource the way a stage thinks of it (group, kind, plural) and
the versions it can read, newest first; the store finds which one the API server serves. The
kinds the built-in stages need are declared here so that every plugin asks for the same
object the same way; a third-party plugin declares its own :class:`Kind` the same way.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Kind:
    group: str
    """The API group ("" for the core group)."""
    kind: str
    plural: str
    versions: tuple[str, ...]
    """Versions the reader understands, newest first; the first one the server serves is used."""
    namespaced: bool = True

    def __str__(self) -> str:
        return f"{self.kind}.{self.group}" if self.group else self.kind

    @property
    def api_prefix(self) -> str:
        return "/api" if not self.group else f"/apis/{self.group}"


NODE = Kind("", "Node", "nodes", ("v1",), namespaced=False)
POD = Kind("", "Pod", "pods", ("v1",))
SECRET = Kind("", "Secret", "secrets", ("v1",))
CONFIG_MAP = Kind("", "ConfigMap", "configmaps", ("v1",))
SERVICE = Kind("", "Service", "services", ("v1",))
SERVICE_ACCOUNT = Kind("", "ServiceAccount", "serviceaccounts", ("v1",))
PERSISTENT_VOLUME_CLAIM = Kind("", "PersistentVolumeClaim", "persistentvolumeclaims", ("v1",))
PERSISTENT_VOLUME = Kind("", "PersistentVolume", "persistentvolumes", ("v1",), namespaced=False)
RUNTIME_CLASS = Kind("node.k8s.io", "RuntimeClass", "runtimeclasses", ("v1",), namespaced=False)
CSI_DRIVER = Kind("storage.k8s.io", "CSIDriver", "csidrivers", ("v1",), namespaced=False)
CSI_NODE = Kind("storage.k8s.io", "CSINode", "csinodes", ("v1",), namespaced=False)
VOLUME_ATTACHMENT = Kind("storage.k8s.io", "VolumeAttachment", "volumeattachments", ("v1",), namespaced=False)
RESOURCE_CLAIM = Kind("resource.k8s.io", "ResourceClaim", "resourceclaims", ("v1", "v1beta2", "v1beta1"))
RESOURCE_SLICE = Kind("resource.k8s.io", "ResourceSlice", "resourceslices", ("v1", "v1beta2", "v1beta1"),
                      namespaced=False)
POD_GROUP = Kind("scheduling.k8s.io", "PodGroup", "podgroups", ("v1beta1", "v1alpha3", "v1alpha2"))
WORKLOAD = Kind("scheduling.k8s.io", "Workload", "workloads", ("v1beta1", "v1alpha3", "v1alpha2", "v1alpha1"))

__all__ = [
    "CONFIG_MAP", "CSI_DRIVER", "CSI_NODE", "Kind", "NODE", "PERSISTENT_VOLUME", "PERSISTENT_VOLUME_CLAIM", "POD",
    "POD_GROUP", "RESOURCE_CLAIM", "RESOURCE_SLICE", "RUNTIME_CLASS", "SECRET", "SERVICE", "SERVICE_ACCOUNT",
    "VOLUME_ATTACHMENT", "WORKLOAD",
]
