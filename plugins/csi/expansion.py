"""Node expansion of a resized PVC (the kubelet's NodeExpander): once the controller side has
grown the volume (the PV's capacity is the new size) and left the rest to the node — the
PVC's ``status.allocatedResourceStatuses.storage`` is ``NodeResizePending`` (or
``NodeResizeInProgress``, an expansion interrupted) — the driver gets NodeExpandVolume (if it
has EXPAND_VOLUME), and the PVC's status says it is done: ``capacity.storage`` the new size,
the resize status and the resize conditions gone. A failure is shown on the PVC as a
``NodeResizeError`` condition and tried again at the next look.

Status writes are JSON merge patches of ``persistentvolumeclaims/status`` made conditional on
the resourceVersion read (the kubelet's PatchPVCStatus), which the NodeRestriction admission
plugin lets a node make for its pods' claims.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nodeagent import quantity
from nodeagent.objects import ObjectError
from nodeagent.objects.kinds import PERSISTENT_VOLUME, PERSISTENT_VOLUME_CLAIM
from nodeagent.stages import PodContext
from plugins.csi import api
from plugins.csi.events import VolumeExpanded
from plugins.csi.layout import Layout
from plugins.csi.mounter import access_mode
from plugins.csi.spec import VolumeSpec

PENDING = ("NodeResizePending", "NodeResizeInProgress")
RESIZE_CONDITIONS = ("Resizing", "FileSystemResizePending", "NodeResizeError")


class Expander:
    async def check(self, ctx: PodContext, client: api.CsiClient, spec: VolumeSpec, target: Path,
                    layout: Layout) -> bool:
        """Expand ``spec``'s volume if its PVC waits for the node; True when it did."""
        assert spec.pvc is not None
        namespace, name = spec.pvc
        pvc = await ctx.objects.get(PERSISTENT_VOLUME_CLAIM, name, namespace, max_age=0)
        if pvc is None:
            return False
        status = pvc.get("status") or {}
        if (status.get("allocatedResourceStatuses") or {}).get("storage") not in PENDING:
            return False
        pv = await ctx.objects.get(PERSISTENT_VOLUME, spec.spec_name, max_age=0)
        new_size = str((((pv or {}).get("spec") or {}).get("capacity") or {}).get("storage") or "")
        if not new_size:
            return False
        if not await client.has(api.NodeCapability.EXPAND_VOLUME):
            await self._finished(ctx, pvc, new_size)  # nothing to do on the node
            return False
        await self._patch(ctx, pvc, {"allocatedResourceStatuses": {"storage": "NodeResizeInProgress"}})
        pvc = await ctx.objects.get(PERSISTENT_VOLUME_CLAIM, name, namespace, max_age=0) or pvc
        staging = ""
        if await client.has(api.NodeCapability.STAGE_UNSTAGE_VOLUME):
            staging = str(layout.block_staging_path(spec.spec_name) if spec.block
                          else layout.staging_path(spec.driver, spec.handle))
        capability = api.Capability(block=spec.block, fs_type=spec.fs_type, mount_flags=spec.mount_options,
                                    access_mode=access_mode(spec, await client.has(
                                        api.NodeCapability.SINGLE_NODE_MULTI_WRITER)))
        try:
            await client.expand(spec.handle, str(target), quantity.bytes_(new_size), capability, staging_path=staging,
                                secrets={})
        except api.CsiCallError as exc:
            conditions = [c for c in (pvc.get("status") or {}).get("conditions") or []
                          if c.get("type") != "NodeResizeError"]
            conditions.append({"type": "NodeResizeError", "status": "True",
                               "message": f"failed to expand pvc with {exc}"})
            await self._patch(ctx, pvc, {"conditions": conditions})
            raise
        await self._finished(ctx, pvc, new_size)
        await ctx.publish(VolumeExpanded(volume=spec.spec_name, capacity=new_size))
        return True

    async def _finished(self, ctx: PodContext, pvc: Any, new_size: str) -> None:
        """MarkNodeExpansionFinishedWithRecovery."""
        status = pvc.get("status") or {}
        others = {k for k in (status.get("allocatedResourceStatuses") or {}) if k != "storage"}
        conditions = [c for c in status.get("conditions") or [] if c.get("type") not in RESIZE_CONDITIONS]
        # A merge patch merges maps: the storage entry goes by a null, the map by a null if empty.
        await self._patch(ctx, pvc, {"capacity": {"storage": new_size},
                                     "allocatedResourceStatuses": {"storage": None} if others else None,
                                     "conditions": conditions or None})

    @staticmethod
    async def _patch(ctx: PodContext, pvc: Any, status: dict[str, Any]) -> None:
        meta = pvc.get("metadata") or {}
        try:
            await ctx.objects.patch(PERSISTENT_VOLUME_CLAIM, str(meta.get("name")),
                                    {"metadata": {"resourceVersion": meta.get("resourceVersion")}, "status": status},
                                    str(meta.get("namespace") or "default"), subresource="status")
        finally:
            ctx.objects.forget(PERSISTENT_VOLUME_CLAIM, str(meta.get("name")), str(meta.get("namespace") or "default"))


__all__ = ["Expander", "ObjectError"]
