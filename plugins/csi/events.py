"""The facts the csi stage publishes. Those the kubelet sends as pod Events say so through
``kube_event`` (FailedMount, FailedMapVolume, SuccessfulMountVolume with its words); the
pod-level "Unable to attach or mount volumes: ..." is the stage's RETRY (a PodWaiting with
reason FailedMount, which the cluster's event recorder shows)."""

from __future__ import annotations

from typing import Literal

from nodeagent.events import Event, KubeEvent


class CsiDriverRegistered(Event):
    """A CSI driver was accepted at its registration socket and installed in the node's
    CSINode (node-level)."""

    kind: Literal["CsiDriverRegistered"] = "CsiDriverRegistered"
    driver: str
    endpoint: str
    socket: str
    version: str
    node_id: str


class CsiDriverDeregistered(Event):
    kind: Literal["CsiDriverDeregistered"] = "CsiDriverDeregistered"
    driver: str
    endpoint: str
    socket: str
    why: str


class CsiPluginRejected(Event):
    """A CSI registration the agent refused; the plugin was told why."""

    kind: Literal["CsiPluginRejected"] = "CsiPluginRejected"
    socket: str
    plugin: str
    message: str


class VolumeOperationFailed(Event):
    """One operation on one volume failed (MountVolume.MountDevice, MountVolume.SetUp,
    MapVolume.MapPodDevice, ...): the kubelet's per-operation Warning Event."""

    kind: Literal["VolumeOperationFailed"] = "VolumeOperationFailed"
    volume: str
    """The volume's spec name (PV name, or the pod's volume name for an inline volume)."""
    operation: str
    error: str
    block: bool = False

    def kube_event(self) -> KubeEvent:
        reason = "FailedMapVolume" if self.block else "FailedMount"
        return KubeEvent("Warning", reason, f'{self.operation} failed for volume "{self.volume}" : {self.error}')


class VolumeMounted(Event):
    """The volume is staged and published for the pod (``adopted``: found so on disk after an
    agent restart, nothing called)."""

    kind: Literal["VolumeMounted"] = "VolumeMounted"
    volume: str
    driver: str
    target: str
    adopted: bool = False
    block: bool = False

    def kube_event(self) -> KubeEvent | None:
        if not self.block or self.adopted:
            return None  # the kubelet sends SuccessfulMountVolume only for mapped block devices
        return KubeEvent("Normal", "SuccessfulMountVolume",
                         f'MapVolume.MapPodDevice succeeded for volume "{self.volume}" volumeMapPath "{self.target}"')


class VolumeUnmounted(Event):
    """NodeUnpublishVolume (and, for the last pod of a staged volume, NodeUnstageVolume)
    succeeded; the directories are gone."""

    kind: Literal["VolumeUnmounted"] = "VolumeUnmounted"
    volume: str
    driver: str
    target: str
    unstaged: bool = False


class VolumeExpanded(Event):
    """NodeExpandVolume succeeded for a resized PVC."""

    kind: Literal["VolumeExpanded"] = "VolumeExpanded"
    volume: str
    capacity: str

    def kube_event(self) -> KubeEvent:
        return KubeEvent("Normal", "FileSystemResizeSuccessful",
                         f"MountVolume.NodeExpandVolume succeeded for volume \"{self.volume}\"")


__all__ = ["CsiDriverDeregistered", "CsiDriverRegistered", "CsiPluginRejected", "VolumeExpanded", "VolumeMounted",
           "VolumeOperationFailed", "VolumeUnmounted"]
