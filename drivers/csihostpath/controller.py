"""The hostpath CSI test driver's controller side in a cluster: minimal stand-ins for the CSI
sidecars the Go module proxy does not serve (external-provisioner, external-resizer) and for
external-attacher when it is not run. Test code: it polls (every ``period`` seconds) instead
of watching, and handles only its own driver's objects.

* **provisioner** — a PVC that the PV controller handed to this driver (annotation
  ``volume.kubernetes.io/storage-provisioner``), of a StorageClass whose provisioner is the
  driver, still Pending (for ``WaitForFirstConsumer``: once the scheduler chose a node,
  annotation ``volume.kubernetes.io/selected-node``) and without a data source, gets CreateVolume and a PV bound to it
  (``claimRef``, the class's reclaim policy, the driver's topology as node affinity); the PV
  controller completes the binding. A Released PV of the driver with reclaim policy Delete
  gets DeleteVolume and is deleted.
* **attacher** (``attach=True``) — a VolumeAttachment naming the driver is attached through
  ControllerPublishVolume (status ``attached`` and ``attachmentMetadata``, a finalizer that
  holds the object until it is detached); when it is deleted, ControllerUnpublishVolume, then
  the finalizer goes.
* **resizer** — a bound PVC of the driver whose request grew past its capacity, of a class
  that allows expansion: the PV gets the new capacity and the PVC
  ``allocatedResourceStatuses.storage: NodeResizePending``, which the node acts on.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import structlog

from drivers.csihostpath import TOPOLOGY_KEY, CsiFailure, HostPathDriver
from nodeagent import quantity

log = structlog.get_logger("csihostpath.controller")

PROVISIONER_ANNOTATION = "volume.kubernetes.io/storage-provisioner"
SELECTED_NODE = "volume.kubernetes.io/selected-node"
PROVISIONED_BY = "pv.kubernetes.io/provisioned-by"


class _Raw:
    """JSON requests on a lightkube client's HTTP session (no model round trips)."""

    def __init__(self, api: Any) -> None:
        self._http = api._client._client

    async def request(self, method: str, path: str, body: Mapping[str, Any] | None = None,
                      content_type: str = "application/json") -> dict[str, Any]:
        response = await self._http.request(method, path, content=json.dumps(body).encode() if body is not None
                                            else None, headers={"Content-Type": content_type})
        if response.status_code >= 400:
            raise RuntimeError(f"{method} {path}: {response.status_code} {response.text[:300]}")
        return response.json() if response.content else {}

    async def items(self, path: str) -> list[dict[str, Any]]:
        return list((await self.request("GET", path)).get("items") or [])

    async def merge(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return await self.request("PATCH", path, body, "application/merge-patch+json")


@dataclass
class Controller:
    driver: HostPathDriver
    api: Any
    """A lightkube AsyncClient with rights over PVCs, PVs, StorageClasses, VolumeAttachments."""
    attach: bool = False
    period: float = 0.5
    provisioned: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        raw = _Raw(self.api)
        task_status.started()
        while True:
            for step in (self._provision, self._delete, self._attach, self._resize):
                try:
                    await step(raw)
                except Exception as exc:  # noqa: BLE001 - a test controller: log, go on
                    log.warning("controller step failed", step=step.__name__, error=str(exc))
            await anyio.sleep(self.period)

    async def _classes(self, raw: _Raw) -> dict[str, dict[str, Any]]:
        return {c["metadata"]["name"]: c for c in await raw.items("/apis/storage.k8s.io/v1/storageclasses")
                if c.get("provisioner") == self.driver.driver_name}

    async def _provision(self, raw: _Raw) -> None:
        classes = await self._classes(raw)
        for pvc in await raw.items("/api/v1/persistentvolumeclaims"):
            meta, spec = pvc["metadata"], pvc.get("spec") or {}
            sc = classes.get(spec.get("storageClassName") or "")
            if sc is None or (pvc.get("status") or {}).get("phase") != "Pending" or spec.get("volumeName"):
                continue
            if (meta.get("annotations") or {}).get(PROVISIONER_ANNOTATION) != self.driver.driver_name:
                continue
            if sc.get("volumeBindingMode") == "WaitForFirstConsumer" and SELECTED_NODE not in (
                    meta.get("annotations") or {}):
                continue
            if spec.get("dataSource") or spec.get("dataSourceRef"):
                # No cloning or snapshots here, and a volume populator's claim is the populator's
                # to fill: an empty volume would be data loss dressed up as success (the
                # external-provisioner leaves such claims alone too).
                continue
            name = f"pvc-{meta['uid']}"
            size = quantity.bytes_((spec.get("resources") or {}).get("requests", {}).get("storage") or "1Gi")
            block = spec.get("volumeMode") == "Block"
            parameters = dict(sc.get("parameters") or {})
            try:
                volume = self.driver.create_volume(name, size, block, parameters)
            except CsiFailure as exc:
                log.warning("CreateVolume failed", pvc=meta["name"], error=exc.message)
                continue
            self.driver.record("CreateVolume", volume["id"])
            pv = {"apiVersion": "v1", "kind": "PersistentVolume",
                  "metadata": {"name": name, "annotations": {PROVISIONED_BY: self.driver.driver_name}},
                  "spec": {"capacity": {"storage": str(volume["capacity"])},
                           "accessModes": spec.get("accessModes") or ["ReadWriteOnce"],
                           "volumeMode": "Block" if block else "Filesystem",
                           "storageClassName": sc["metadata"]["name"],
                           "persistentVolumeReclaimPolicy": sc.get("reclaimPolicy") or "Delete",
                           "mountOptions": sc.get("mountOptions") or [],
                           "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                                        "namespace": meta["namespace"], "name": meta["name"], "uid": meta["uid"]},
                           "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                               {"key": TOPOLOGY_KEY, "operator": "In", "values": [self.driver.node_id]}]}]}},
                           "csi": {"driver": self.driver.driver_name, "volumeHandle": volume["id"],
                                   "volumeAttributes": volume["context"],
                                   **({"fsType": parameters["csi.storage.k8s.io/fstype"]}
                                      if "csi.storage.k8s.io/fstype" in parameters else {})}}}
            try:
                await raw.request("POST", "/api/v1/persistentvolumes", pv)
            except RuntimeError as exc:
                if "409" not in str(exc):
                    raise
            self.provisioned.append(name)
            log.info("provisioned", pvc=f"{meta['namespace']}/{meta['name']}", pv=name)

    async def _delete(self, raw: _Raw) -> None:
        for pv in await raw.items("/api/v1/persistentvolumes"):
            meta, spec = pv["metadata"], pv.get("spec") or {}
            if (meta.get("annotations") or {}).get(PROVISIONED_BY) != self.driver.driver_name:
                continue
            if (pv.get("status") or {}).get("phase") != "Released" or spec.get(
                    "persistentVolumeReclaimPolicy") != "Delete":
                continue
            self.driver.delete_volume(spec["csi"]["volumeHandle"])
            self.driver.record("DeleteVolume", spec["csi"]["volumeHandle"])
            await raw.request("DELETE", f"/api/v1/persistentvolumes/{meta['name']}")
            self.deleted.append(meta["name"])
            log.info("deleted", pv=meta["name"])

    async def _attach(self, raw: _Raw) -> None:
        if not self.attach:
            return
        finalizer = f"external-attacher/{self.driver.driver_name.replace('/', '-')}"
        for va in await raw.items("/apis/storage.k8s.io/v1/volumeattachments"):
            meta, spec = va["metadata"], va.get("spec") or {}
            if spec.get("attacher") != self.driver.driver_name:
                continue
            path = f"/apis/storage.k8s.io/v1/volumeattachments/{meta['name']}"
            handle = (spec.get("source") or {}).get("persistentVolumeName")
            if meta.get("deletionTimestamp"):
                if finalizer in (meta.get("finalizers") or []):
                    self.driver.record("ControllerUnpublishVolume", str(handle))
                    await raw.merge(path, {"metadata": {"finalizers": [f for f in meta["finalizers"]
                                                                       if f != finalizer]}})
                continue
            if (va.get("status") or {}).get("attached"):
                continue
            pv = await raw.request("GET", f"/api/v1/persistentvolumes/{handle}")
            volume_id = pv["spec"]["csi"]["volumeHandle"]
            self.driver.record("ControllerPublishVolume", volume_id)
            if finalizer not in (meta.get("finalizers") or []):
                await raw.merge(path, {"metadata": {"finalizers": [*(meta.get("finalizers") or []), finalizer]}})
            await raw.merge(f"{path}/status", {"status": {
                "attached": True, "attachmentMetadata": {"device": str(self.driver.volume_path(volume_id))}}})

    async def _resize(self, raw: _Raw) -> None:
        classes = await self._classes(raw)
        for pvc in await raw.items("/api/v1/persistentvolumeclaims"):
            meta, spec, status = pvc["metadata"], pvc.get("spec") or {}, pvc.get("status") or {}
            sc = classes.get(spec.get("storageClassName") or "")
            if sc is None or not sc.get("allowVolumeExpansion") or status.get("phase") != "Bound":
                continue
            wanted = (spec.get("resources") or {}).get("requests", {}).get("storage")
            have = (status.get("capacity") or {}).get("storage")
            if not wanted or not have or quantity.bytes_(wanted) <= quantity.bytes_(have):
                continue
            if (status.get("allocatedResourceStatuses") or {}).get("storage"):
                continue  # already handed to the node
            pv_path = f"/api/v1/persistentvolumes/{spec['volumeName']}"
            await raw.merge(pv_path, {"spec": {"capacity": {"storage": wanted}}})
            await raw.merge(f"/api/v1/namespaces/{meta['namespace']}/persistentvolumeclaims/{meta['name']}/status",
                            {"status": {"allocatedResources": {"storage": wanted},
                                        "allocatedResourceStatuses": {"storage": "NodeResizePending"}}})
            log.info("resized on the controller side; node expansion pending", pvc=meta["name"], size=wanted)


__all__ = ["Controller"]
