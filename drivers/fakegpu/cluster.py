"""The fake GPU driver's side of a cluster: it publishes what it has (a ResourceSlice) and reads
what the scheduler gave a claim (the ResourceClaim's allocation) — the control-plane half of what
k8s.io/dynamic-resource-allocation's kubeletplugin helper does for a real driver.

Credentials: a real driver runs as a DaemonSet with its own ServiceAccount and RBAC. Ours is
given a kubeconfig, typically the node's own, and that is enough: the Node authorizer lets a
node create ResourceSlices and get/update/delete those of its own node (NodeRestriction refuses
a slice naming another node), and get the ResourceClaims its pods reference.

The slice: one per node and driver, named ``<node>-<driver>``, pool = the node's name, one device
per fake GPU with attributes the scheduler's CEL selectors can match (``index``, ``model``,
``driverVersion``) and a ``memory`` capacity; owned by the Node, so deleting the Node collects it.
It is checked every ``resync_seconds`` and made right again (created if someone deleted it —
the kubelet wipes a vanished driver's slices —, replaced with the next pool generation if it
differs), and deleted when the driver stops cleanly: its devices are gone with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import anyio
import structlog
from lightkube import ApiError
from lightkube.resources.core_v1 import Node
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice

log = structlog.get_logger("fakegpu.cluster")

RESYNC_SECONDS = 10.0
MODEL = "fake-gpu-1"
DRIVER_VERSION = "1.0.0"


def slice_name(node: str, driver: str) -> str:
    return f"{node}-{driver}"


def desired_devices(count: int) -> list[dict[str, Any]]:
    return [{"name": f"gpu{i}",
             "attributes": {"index": {"int": i}, "model": {"string": MODEL},
                            "driverVersion": {"version": DRIVER_VERSION}},
             "capacity": {"memory": {"value": "1Gi"}}} for i in range(count)]


@dataclass
class SlicePublisher:
    api: Any
    """A lightkube AsyncClient."""
    driver: str
    node: str
    devices: int
    resync_seconds: float = RESYNC_SECONDS
    _published: bool = False

    @property
    def name(self) -> str:
        return slice_name(self.node, self.driver)

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Publish, report started once the slice is there, keep it right; delete it on the way
        out. Failures (the Node not registered yet, the API server away) are retried."""
        started = False
        try:
            while True:
                try:
                    await self.sync()
                    if not started:
                        started = True
                        task_status.started()
                except Exception as exc:  # noqa: BLE001 - never fatal for the driver: retried
                    log.warning("publishing the ResourceSlice failed; retrying", slice=self.name, error=str(exc))
                await anyio.sleep(self.resync_seconds if started else 1.0)
        finally:
            with anyio.move_on_after(5, shield=True):
                await self.remove()

    async def sync(self) -> None:
        """Create the slice, or replace it if it differs from what the driver has."""
        try:
            node = await self.api.get(Node, self.node)
        except ApiError as exc:
            if exc.status.code == 404:
                raise RuntimeError(f"node {self.node} is not registered yet") from None
            raise
        try:
            current = (await self.api.get(ResourceSlice, self.name)).to_dict()
        except ApiError as exc:
            # The Node authorizer knows only slices that exist: asking for a missing one is
            # forbidden ("no relationship found"), not 404.
            if exc.status.code not in (403, 404):
                raise
            await self.api.create(ResourceSlice.from_dict(self.manifest(node.metadata.uid, 1)))
            log.info("ResourceSlice published", slice=self.name, devices=self.devices)
            self._published = True
            return
        spec = current.get("spec") or {}
        wanted = self.manifest(node.metadata.uid, int((spec.get("pool") or {}).get("generation", 0)))
        self._published = True
        if _same(spec, wanted["spec"]):
            return
        # A new generation: the scheduler ignores slices of an older generation of the pool.
        wanted["spec"]["pool"]["generation"] += 1
        wanted["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        await self.api.replace(ResourceSlice.from_dict(wanted))
        log.info("ResourceSlice updated", slice=self.name, generation=wanted["spec"]["pool"]["generation"])

    async def remove(self) -> None:
        if not self._published:
            return
        try:
            await self.api.delete(ResourceSlice, self.name)
            log.info("ResourceSlice removed", slice=self.name)
        except Exception as exc:  # noqa: BLE001 - best effort on the way out
            if not (isinstance(exc, ApiError) and exc.status.code in (403, 404)):  # gone already
                log.warning("removing the ResourceSlice failed", slice=self.name, error=str(exc))

    def manifest(self, node_uid: str | None, generation: int) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": self.name}
        if node_uid:
            meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": node_uid,
                                        "controller": True}]
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": meta,
                "spec": {"driver": self.driver, "nodeName": self.node,
                         "pool": {"name": self.node, "generation": max(generation, 1), "resourceSliceCount": 1},
                         "devices": desired_devices(self.devices)}}


def _same(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    pool, want_pool = current.get("pool") or {}, wanted["pool"]
    return (current.get("driver") == wanted["driver"] and current.get("nodeName") == wanted["nodeName"]
            and pool.get("name") == want_pool["name"] and pool.get("resourceSliceCount") == 1
            and current.get("devices") == wanted["devices"])


async def allocation(api: Any, namespace: str, name: str, uid: str, driver: str,
                     pool: str) -> tuple[list[tuple[str, str]], str]:
    """((device, request) pairs of this driver and pool allocated to the claim, error). The UID
    must match: a claim deleted and made again under the same name is another claim."""
    try:
        claim = (await api.get(ResourceClaim, name, namespace=namespace)).to_dict()
    except Exception as exc:  # noqa: BLE001 - reported to the node agent as this claim's error
        return [], f"cannot read ResourceClaim {namespace}/{name}: {exc}"
    if (claim.get("metadata") or {}).get("uid") != uid:
        return [], f"ResourceClaim {namespace}/{name} has UID {claim['metadata'].get('uid')}, not {uid}"
    results = ((((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results")) or []
    mine = [(r.get("device", ""), r.get("request", "")) for r in results
            if r.get("driver") == driver and r.get("pool") == pool]
    if not mine:
        return [], f"ResourceClaim {namespace}/{name} has no device of driver {driver} in pool {pool}"
    return mine, ""


__all__ = ["SlicePublisher", "allocation", "desired_devices", "slice_name"]
