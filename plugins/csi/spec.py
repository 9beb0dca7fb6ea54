"""From a pod's volume to what the node mounts: the kubelet's desired-state populator
(createVolumeSpec, getPVCExtractPV, getPVSpec) and its CSI plugin's reading of a spec.

A ``persistentVolumeClaim`` volume is followed to its PVC (which must be Bound and name its
PV), an ``ephemeral`` one to the PVC the ephemeral-volume controller made for the pod (which
the pod must own), and that PVC to its PV (whose claimRef must be that PVC). The PV's source
decides how it is mounted: ``csi`` (a driver publishes it), ``local`` or ``hostPath`` (a
directory of the node, bound into the container). A ``csi`` inline volume needs no API
object but its driver's CSIDriver, which must list the ``Ephemeral`` lifecycle mode.

Reads go through the object store by name, fresh (the PVC's phase changes while the pod
waits); a node may read exactly the PVCs and PVs its pods reference (the Node authorizer).
Problems are :class:`NotReady` with the kubelet's messages: the pod waits.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from nodeagent.model import Pod, Volume
from nodeagent.objects import ObjectError, ObjectStore, Snapshot
from nodeagent.objects.kinds import PERSISTENT_VOLUME, PERSISTENT_VOLUME_CLAIM
from plugins.csi.layout import inline_volume_id

PVC_PROTECTION = "kubernetes.io/pvc-protection"
READ_FRESH_SECONDS = 0.5
"""A PVC or PV read is reused for at most this long: the pod waits for them to change."""


class NotReady(Exception):
    """The volume cannot be processed yet (the kubelet's "failed to process volumes"): its PVC
    is not bound, its PV is not readable, ... The pod waits and the volume is looked at again."""


@dataclass(frozen=True)
class SecretRef:
    namespace: str
    name: str


@dataclass(frozen=True)
class VolumeSpec:
    """One pod volume, as the node mounts it."""

    volume: str
    """The pod's volume name (the kubelet's outer volume spec name)."""
    spec_name: str
    """The PV's name, or the pod's volume name for an inline volume."""
    source: Literal["csi", "local", "hostPath"]
    block: bool = False
    read_only: bool = False
    driver: str = ""
    handle: str = ""
    fs_type: str = ""
    mount_options: tuple[str, ...] = ()
    attributes: Mapping[str, str] = field(default_factory=dict)
    access_modes: tuple[str, ...] = ("ReadWriteOnce",)
    lifecycle: Literal["Persistent", "Ephemeral"] = "Persistent"
    stage_secret: SecretRef | None = None
    publish_secret: SecretRef | None = None
    expand_secret: SecretRef | None = None
    path: str = ""
    """local / hostPath: the node's directory."""
    host_path_type: str = ""
    pvc: tuple[str, str] | None = None
    """(namespace, name) of the claim."""
    pvc_object: Snapshot | None = None
    pv_object: Snapshot | None = None

    @property
    def pv_capacity(self) -> str:
        return str((((self.pv_object or {}).get("spec") or {}).get("capacity") or {}).get("storage") or "")


def used_volumes(pod: Pod) -> dict[str, Literal["mount", "device"]]:
    """The pod's volumes a container mounts or maps (the kubelet skips the others)."""
    used: dict[str, Literal["mount", "device"]] = {}
    for container in pod.all_containers():
        for mount in container.volume_mounts:
            used.setdefault(mount.name, "mount")
        for device in container.volume_devices:
            used[device.name] = "device"
    return used


def handles(volume: Volume) -> bool:
    """A volume this stage sets up."""
    return volume.persistent_volume_claim is not None or volume.ephemeral is not None or volume.csi is not None


def ephemeral_claim_name(pod: Pod, volume: Volume) -> str:
    """``<pod name>-<volume name>`` (component-helpers ephemeral.VolumeClaimName)."""
    return f"{pod.metadata.name}-{volume.name}"


async def resolve(objects: ObjectStore, pod: Pod, volume: Volume, uses: Literal["mount", "device"],
                  drivers: Mapping[str, Snapshot]) -> VolumeSpec:
    """The volume as the node mounts it; NotReady while it cannot be. ``drivers``: the
    cluster's CSIDriver objects by name."""
    if volume.csi is not None:
        return _inline(pod, volume, drivers)
    source = volume.persistent_volume_claim
    read_only = bool(source.read_only) if source is not None else False
    claim = source.claim_name if source is not None else ephemeral_claim_name(pod, volume)
    namespace = pod.metadata.namespace
    try:
        pvc = await _claim(objects, namespace, claim)
        if volume.ephemeral is not None and not _controlled_by(pvc, pod):
            raise NotReady(f"PVC {namespace}/{claim} was not created for pod {namespace}/{pod.metadata.name} "
                           "(pod is not owner)")
        pv = await _volume(objects, pvc)
    except NotReady as exc:
        if "(pod is not owner)" in str(exc):
            raise
        raise NotReady(f"error processing PVC {namespace}/{claim}: {exc}") from None
    spec = _from_pv(volume.name, pv, read_only, (namespace, claim), pvc)
    if uses == "mount" and spec.block:
        raise NotReady(f"volume {volume.name} has volumeMode Block, but is specified in volumeMounts")
    if uses == "device" and not spec.block:
        raise NotReady(f"volume {volume.name} has volumeMode Filesystem, but is specified in volumeDevices")
    return spec


async def _claim(objects: ObjectStore, namespace: str, name: str) -> Snapshot:
    try:
        pvc = await objects.get(PERSISTENT_VOLUME_CLAIM, name, namespace, max_age=READ_FRESH_SECONDS)
    except ObjectError as exc:
        raise NotReady(f"failed to fetch PVC from API server: {exc}") from None
    if pvc is None:
        raise NotReady(f'failed to fetch PVC from API server: persistentvolumeclaims "{name}" not found')
    meta = pvc.get("metadata") or {}
    if meta.get("deletionTimestamp") and PVC_PROTECTION not in (meta.get("finalizers") or []):
        raise NotReady("PVC is being deleted")
    if (pvc.get("status") or {}).get("phase") != "Bound":
        raise NotReady("PVC is not bound")
    if not (pvc.get("spec") or {}).get("volumeName"):
        raise NotReady("PVC has empty pvc.Spec.VolumeName")
    return pvc


async def _volume(objects: ObjectStore, pvc: Snapshot) -> Snapshot:
    name = str(pvc["spec"]["volumeName"])
    try:
        pv = await objects.get(PERSISTENT_VOLUME, name, max_age=READ_FRESH_SECONDS)
    except ObjectError as exc:
        raise NotReady(f"failed to fetch PV {name} from API server: {exc}") from None
    if pv is None:
        raise NotReady(f'failed to fetch PV {name} from API server: persistentvolumes "{name}" not found')
    claim_ref = (pv.get("spec") or {}).get("claimRef")
    if not claim_ref:
        raise NotReady(f"found PV object {name} but it has a nil pv.Spec.ClaimRef indicating it is not yet bound "
                       "to the claim")
    uid = (pvc.get("metadata") or {}).get("uid")
    if claim_ref.get("uid") != uid:
        raise NotReady(f"found PV object {name} but its pv.Spec.ClaimRef.UID {claim_ref.get('uid')} does not point "
                       f"to claim.UID {uid}")
    return pv


def _controlled_by(obj: Snapshot, pod: Pod) -> bool:
    meta = obj.get("metadata") or {}
    if (meta.get("namespace") or "default") != pod.metadata.namespace:
        return False
    return any(ref.get("controller") and ref.get("uid") == pod.uid for ref in meta.get("ownerReferences") or [])


def _secret(ref: Any) -> SecretRef | None:
    if not isinstance(ref, Mapping) or not ref.get("name"):
        return None
    return SecretRef(str(ref.get("namespace") or "default"), str(ref["name"]))


def _from_pv(volume: str, pv: Snapshot, pvc_read_only: bool, claim: tuple[str, str], pvc: Snapshot) -> VolumeSpec:
    spec = pv.get("spec") or {}
    name = str((pv.get("metadata") or {}).get("name") or "")
    common: dict[str, Any] = dict(
        volume=volume, spec_name=name, block=spec.get("volumeMode") == "Block",
        mount_options=tuple(spec.get("mountOptions") or ()),
        access_modes=tuple(spec.get("accessModes") or ("ReadWriteOnce",)), pvc=claim, pvc_object=pvc, pv_object=pv)
    csi = spec.get("csi")
    if isinstance(csi, Mapping):
        return VolumeSpec(
            source="csi", read_only=pvc_read_only or bool(csi.get("readOnly")), driver=str(csi.get("driver") or ""),
            handle=str(csi.get("volumeHandle") or ""), fs_type=str(csi.get("fsType") or ""),
            attributes=dict(csi.get("volumeAttributes") or {}),
            stage_secret=_secret(csi.get("nodeStageSecretRef")),
            publish_secret=_secret(csi.get("nodePublishSecretRef")),
            expand_secret=_secret(csi.get("nodeExpandSecretRef")), **common)
    local = spec.get("local")
    if isinstance(local, Mapping) and local.get("path"):
        return VolumeSpec(source="local", read_only=pvc_read_only, path=str(local["path"]),
                          fs_type=str(local.get("fsType") or ""), **common)
    host_path = spec.get("hostPath")
    if isinstance(host_path, Mapping) and host_path.get("path"):
        return VolumeSpec(source="hostPath", read_only=pvc_read_only, path=str(host_path["path"]),
                          host_path_type=str(host_path.get("type") or ""), **common)
    sources = sorted(k for k, v in spec.items() if isinstance(v, Mapping) and k not in ("claimRef", "capacity",
                                                                                     "nodeAffinity"))
    raise NotReady(f"PV {name}: no volume plugin matched (nodeagent mounts csi, local and hostPath "
                   f"persistent volumes; this one has {', '.join(sources) or 'no source'})")


def _inline(pod: Pod, volume: Volume, drivers: Mapping[str, Snapshot]) -> VolumeSpec:
    source = volume.csi
    assert source is not None
    driver = drivers.get(source.driver)
    if driver is None:
        raise NotReady(f'volume mode "Ephemeral" not supported by driver {source.driver} (no CSIDriver object)')
    modes = list(((driver.get("spec") or {}).get("volumeLifecycleModes")) or ["Persistent"])
    if "Ephemeral" not in modes:
        quoted = "[" + " ".join(f'"{m}"' for m in modes) + "]"
        raise NotReady(f'volume mode "Ephemeral" not supported by driver {source.driver} (only supports {quoted})')
    secret = source.node_publish_secret_ref
    return VolumeSpec(
        volume=volume.name, spec_name=volume.name, source="csi", read_only=bool(source.read_only),
        driver=source.driver, handle=inline_volume_id(pod.uid, volume.name), fs_type=source.fs_type or "",
        attributes=dict(source.volume_attributes), lifecycle="Ephemeral",
        publish_secret=SecretRef(pod.metadata.namespace, secret.name) if secret is not None and secret.name else None)


__all__ = ["NotReady", "SecretRef", "VolumeSpec", "ephemeral_claim_name", "handles", "resolve", "used_volumes"]
