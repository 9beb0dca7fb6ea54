"""Persistent volumes that are a directory (or device) of the node: ``local`` and ``hostPath``
PVs (the kubelet's local-volume and host-path plugins), the volumes a local StorageClass
(``kubernetes.io/no-provisioner``) and static provisioning give.

Nothing is staged or published: containers get the path itself. A ``local`` PV's
``nodeAffinity`` must match the node; its path must exist (a directory for Filesystem, a block
device for Block) and, unless read-only, it is given to the pod's fsGroup as the kubelet's
local plugin does. A ``hostPath`` PV has its type checked here and again, on the opened
path, at every container start (nodeagent/volumebind.py), as the volumes stage's hostPath.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path

import anyio

from nodeagent import volumebind
from nodeagent.kube import nodeaffinity
from plugins.csi.mounter import PodInfo, apply_ownership
from plugins.csi.spec import VolumeSpec


class LocalError(Exception):
    """The node's path cannot be given to the pod (FailedMount; retried)."""


async def set_up_local(spec: VolumeSpec, pod: PodInfo, node_labels: Mapping[str, str]) -> tuple[Path, str | None]:
    """(the host path, the hostPath type to check at container start, or None)."""
    path = Path(spec.path)
    if spec.source == "hostPath":
        try:
            await anyio.to_thread.run_sync(volumebind.check_host_path, spec.path, spec.host_path_type)
        except volumebind.HostPathTypeError as exc:
            raise LocalError(str(exc)) from None
        return path, spec.host_path_type
    affinity = (((spec.pv_object or {}).get("spec") or {}).get("nodeAffinity") or {}).get("required")
    if affinity is not None:
        node = str(node_labels.get("kubernetes.io/hostname", ""))
        if not nodeaffinity.matches(node, node_labels, {},
                                    {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": affinity}}):
            raise LocalError("no matching NodeSelectorTerms")
    try:
        info = await anyio.to_thread.run_sync(os.stat, path)
    except OSError as exc:
        raise LocalError(f"path {spec.path!r} does not exist: {exc.strerror}") from None
    if spec.block:
        if not stat.S_ISBLK(info.st_mode):
            raise LocalError(f"path {spec.path!r} is not a block device")
        return path, None
    if not stat.S_ISDIR(info.st_mode):
        raise LocalError(f"path {spec.path!r} is not a directory")
    if pod.fs_group is not None and not spec.read_only:
        await apply_ownership(path, pod.fs_group, pod.fs_group_change_policy)
    return path, None


__all__ = ["LocalError", "set_up_local"]
