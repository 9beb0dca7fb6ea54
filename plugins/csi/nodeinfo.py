"""What the cluster learns about the node's CSI drivers (the kubelet's nodeinfomanager): the
node's ``CSINode`` object and two things on the Node itself.

* ``CSINode`` (``storage.k8s.io/v1``), named after the node and owned by it: one
  ``spec.drivers[]`` entry per registered driver — its name, the node ID the driver gave in
  NodeGetInfo, its topology keys (sorted) and, when it reported one, ``allocatable.count``
  (its max_volumes_per_node). The scheduler counts volumes against it. Made at start with no
  drivers (the kubelet's InitializeCSINodeWithAnnotation); a CSINode owned by an older Node
  of the same name is replaced.
* the Node's annotation ``csi.volume.kubernetes.io/nodeid``: a JSON map driver → node ID;
* the Node's labels: every topology segment the driver reported (a label the node already has
  with another value is an error, as in the kubelet: the driver is not registered).

Deregistration takes the driver out of both (its topology labels stay, as the kubelet leaves
them). Every write goes through the object store with the node's credentials, which the
NodeRestriction admission plugin lets write exactly these objects.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import structlog

from nodeagent.objects import ObjectError, ObjectStore
from nodeagent.objects.kinds import CSI_NODE, NODE

log = structlog.get_logger("nodeagent.csi")

NODE_ID_ANNOTATION = "csi.volume.kubernetes.io/nodeid"
MIGRATED_PLUGINS_ANNOTATION = "storage.alpha.kubernetes.io/migrated-plugins"
CONFLICT_ATTEMPTS = 5
MAX_INT32 = 2**31 - 1


class NodeInfoError(Exception):
    """The Node or CSINode could not be written (registration fails and is tried again)."""


class NodeInfoManager:
    def __init__(self, objects: ObjectStore, node_name: str) -> None:
        self._objects = objects
        self._node = node_name

    async def _node_object(self) -> Mapping[str, Any]:
        node = await self._objects.get(NODE, self._node, max_age=0)
        if node is None:
            raise NodeInfoError(f"node {self._node} is not registered yet")
        return node

    # --- CSINode ---------------------------------------------------------------------------

    async def ensure_csinode(self) -> Mapping[str, Any]:
        """The node's CSINode, made (empty) if missing, replaced if another Node owned it."""
        node = await self._node_object()
        uid = (node.get("metadata") or {}).get("uid")
        current = await self._objects.get(CSI_NODE, self._node, max_age=0)
        if current is not None:
            owners = [r for r in (current.get("metadata") or {}).get("ownerReferences") or []
                      if r.get("kind") == "Node" and r.get("name") == self._node]
            if not owners or any(r.get("uid") == uid for r in owners):
                return current
            log.warning("CSINode was owned by an older Node of the same name; replacing it", node=self._node)
            await self._objects.delete(CSI_NODE, self._node)
            self._objects.forget(CSI_NODE, self._node)
        body = {"apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
                "metadata": {"name": self._node, "annotations": {MIGRATED_PLUGINS_ANNOTATION: ""},
                             "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": self._node, "uid": uid}]},
                "spec": {"drivers": []}}
        try:
            return await self._objects.create(CSI_NODE, body)
        except ObjectError as exc:
            if exc.code != 409:
                raise
            found = await self._objects.get(CSI_NODE, self._node, max_age=0)
            if found is None:
                raise
            return found

    async def _update_drivers(self, change: Any) -> None:
        """Apply ``change(drivers) -> drivers | None`` to spec.drivers, conditionally on the
        object's resourceVersion, again on a conflict."""
        for attempt in range(CONFLICT_ATTEMPTS):
            current = await self.ensure_csinode()
            drivers = list((current.get("spec") or {}).get("drivers") or [])
            wanted = change(drivers)
            if wanted is None:
                return
            body = {**current, "spec": {**(current.get("spec") or {}), "drivers": wanted}}
            try:
                await self._objects.update(CSI_NODE, body)
                return
            except ObjectError as exc:
                if exc.code != 409 or attempt == CONFLICT_ATTEMPTS - 1:
                    raise NodeInfoError(f"error updating CSINode: {exc}") from None
                self._objects.forget(CSI_NODE, self._node)

    # --- install / uninstall ---------------------------------------------------------------

    async def install(self, driver: str, node_id: str, max_volumes: int, topology: Mapping[str, str]) -> None:
        """InstallCSIDriver: the Node's annotation and labels, then the CSINode entry."""
        if not node_id:
            raise NodeInfoError("error adding CSI driver node info: driverNodeID must not be empty")
        try:
            await self._install_on_node(driver, node_id, topology)
        except (ObjectError, NodeInfoError) as exc:
            raise NodeInfoError(f"error updating Node object with CSI driver node info: {exc}") from None
        entry: dict[str, Any] = {"name": driver, "nodeID": node_id, "topologyKeys": sorted(topology)}
        if max_volumes > 0:
            entry["allocatable"] = {"count": min(max_volumes, MAX_INT32)}

        def change(drivers: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
            same = [d for d in drivers if d.get("name") == driver]
            if same and _same(same[0], entry):
                return None
            return [d for d in drivers if d.get("name") != driver] + [entry]

        try:
            await self._update_drivers(change)
        except ObjectError as exc:
            raise NodeInfoError(f"error updating CSINode object with CSI driver node info: {exc}") from None

    async def _install_on_node(self, driver: str, node_id: str, topology: Mapping[str, str]) -> None:
        node = await self._node_object()
        meta = node.get("metadata") or {}
        ids = _node_ids(meta)
        labels = meta.get("labels") or {}
        for key, value in topology.items():
            if key in labels and labels[key] != value:
                raise NodeInfoError(f"detected topology value collision: driver reported {key!r}:{value!r} but "
                                    f"existing label is {key!r}:{labels[key]!r}")
        patch: dict[str, Any] = {}
        if ids.get(driver) != node_id:
            patch["annotations"] = {NODE_ID_ANNOTATION: json.dumps({**ids, driver: node_id}, sort_keys=True)}
        missing = {k: v for k, v in topology.items() if labels.get(k) != v}
        if missing:
            patch["labels"] = missing
        if patch:
            await self._objects.patch(NODE, self._node, {"metadata": patch})

    async def uninstall(self, driver: str) -> None:
        """UninstallCSIDriver: out of the CSINode and the node-ID annotation."""
        def change(drivers: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
            kept = [d for d in drivers if d.get("name") != driver]
            return kept if len(kept) != len(drivers) else None

        try:
            await self._update_drivers(change)
        except ObjectError as exc:
            raise NodeInfoError(f"error uninstalling CSI driver from CSINode object {exc}") from None
        try:
            node = await self._node_object()
            ids = _node_ids(node.get("metadata") or {})
            if driver in ids:
                del ids[driver]
                value = json.dumps(ids, sort_keys=True) if ids else None
                await self._objects.patch(NODE, self._node, {"metadata": {"annotations": {NODE_ID_ANNOTATION: value}}})
        except (ObjectError, NodeInfoError) as exc:
            raise NodeInfoError(f"error removing CSI driver node info from Node object {exc}") from None


def _node_ids(meta: Mapping[str, Any]) -> dict[str, str]:
    raw = (meta.get("annotations") or {}).get(NODE_ID_ANNOTATION)
    if not raw:
        return {}
    try:
        ids = json.loads(raw)
    except ValueError:
        raise NodeInfoError(f"failed to parse node annotation {NODE_ID_ANNOTATION!r}: {raw!r}") from None
    return {str(k): str(v) for k, v in ids.items()} if isinstance(ids, dict) else {}


def _same(existing: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    return (existing.get("nodeID") == wanted.get("nodeID")
            and sorted(existing.get("topologyKeys") or []) == wanted.get("topologyKeys")
            and (existing.get("allocatable") or {}).get("count") == (wanted.get("allocatable") or {}).get("count"))


__all__ = ["NODE_ID_ANNOTATION", "NodeInfoError", "NodeInfoManager"]
