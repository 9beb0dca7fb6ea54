"""Image volumes (``volumes[].image``, KEP-4639): an OCI image the runtime mounts read-only
into the containers that mount the volume — the kubelet's getImageVolumes and makeMounts.

Each image volume's image is ensured like a container's (pull policy, the pod's pull secrets
and the node's credentials, pull back-off, pull records), before the pod's first container
starts. The runtime mounts it, not us: the container's CRI ``Mount`` names the image
(``Mount.image``, the image ID we ensured, with ``image_sub_path`` for a subPath) and no host
path; containerd 2.1+ unpacks it into a snapshot under the sandbox, mounts it once per pod and
image, binds it (or the subPath's directory, which must exist: ``ImageVolumeMountFailed``)
into the container, and removes it with the sandbox. So nothing here is ever undone by us.

As the kubelet's toKubeContainerImageVolumes: a volume whose image cannot be had holds back
only the containers that mount it — each waits with the pull's reason (ErrImagePull,
ImagePullBackOff, ErrImageNeverPull) and the pull is tried again, with its back-off, when
the container's start comes round again (:func:`ensure_for`) — and a volume no container
mounts is still pulled and keeps nothing from starting.
"""

from __future__ import annotations

from collections.abc import Mapping

from cri import types as t
from nodeagent.kube.env import FieldError, container_env
from nodeagent.model import Container, Pod, Volume
from nodeagent.stages import PodContext, Result
from nodeagent.stash import StashKey
from nodeagent.volumeutil.mounts import (
    PROPAGATION,
    MountConfigError,
    check_sub_path,
    sub_path_of,
)
from plugins.runtime.container import pod_facts
from plugins.runtime.events import ImageVolumePullFailed
from plugins.runtime.images import ImagePuller
from plugins.runtime.pullsecrets import PullSecrets

IMAGE_VOLUME_REFS = StashKey[dict[str, str]]("runtime.image_volume_refs")
"""Volume name -> the image ID ensured for it (absent: not ensured, or its pull failed)."""


def image_volumes(pod: Pod) -> list[Volume]:
    return [v for v in pod.spec.volumes if v.image is not None]


def mounting(pod: Pod, volume: str) -> list[str]:
    """The containers (init, regular, ephemeral) that mount ``volume``."""
    containers: list[Container] = [*pod.all_containers(), *pod.spec.ephemeral_containers]
    return [c.name for c in containers if any(m.name == volume for m in c.volume_mounts)]


async def ensure(ctx: PodContext, puller: ImagePuller, secrets: PullSecrets) -> None:
    """Ensure every image volume's image (all of them, as the kubelet: one failing does not
    stop the others). A failure shows on the containers that mount the volume; they try
    again at their start (:func:`ensure_for`)."""
    refs: dict[str, str] = {}
    for volume in image_volumes(ctx.pod):
        source = volume.image
        assert source is not None
        users = mounting(ctx.pod, volume.name)
        ref, failed = await puller.ensure_image(ctx, source.reference, source.policy, users, secrets)
        if failed is None:
            refs[volume.name] = ref
        else:
            ctx.log.info("image of an image volume not available", volume=volume.name,
                         image=source.reference, reason=failed.reason, mounted_by=users)
            await _told(ctx, users[0] if users else "", failed)
    ctx.stash[IMAGE_VOLUME_REFS] = refs


async def ensure_for(ctx: PodContext, puller: ImagePuller, container: Container) -> Result | None:
    """Before ``container`` starts: the images of the volumes it mounts that are not ensured
    yet, tried again (with the pull back-off). None when all are there, else the RETRY that
    says why not (the container shows it as its waiting reason)."""
    refs = ctx.stash.setdefault(IMAGE_VOLUME_REFS, {})
    wanted = {m.name for m in container.volume_mounts}
    secrets: PullSecrets | None = None
    for volume in image_volumes(ctx.pod):
        if volume.name not in wanted or volume.name in refs:
            continue
        source = volume.image
        assert source is not None
        secrets = secrets or PullSecrets(ctx)
        ref, failed = await puller.ensure_image(ctx, source.reference, source.policy, (container.name,), secrets)
        if failed is not None:
            await _told(ctx, container.name, failed)
            return failed
        refs[volume.name] = ref
    return None


async def _told(ctx: PodContext, container: str, failed: Result) -> None:
    """The kubelet's image puller events, on the pod (an image volume has no container)."""
    if failed.reason in ("ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull"):
        await ctx.publish(ImageVolumePullFailed(container=container, reason=failed.reason,  # type: ignore[arg-type]
                                                message=failed.message))


def mounts(ctx: PodContext, pod: Pod, container: Container,
           env: Mapping[str, str] | None = None) -> list[t.Mount]:
    """The CRI mounts of ``container``'s image volumes (makeMounts with imageVolumes): read-only
    always (containerd refuses an image mount that is not), no host path, the ensured image ID,
    the subPath as ``image_sub_path``. ``env`` expands subPathExpr (computed when None).

    Raises :class:`MountConfigError` for a subPath that cannot be used, and for a volume whose
    image was not ensured (prepare ran for an older spec)."""
    refs = ctx.stash.get(IMAGE_VOLUME_REFS) or {}
    sources = {v.name: v.image for v in pod.spec.volumes if v.image is not None}
    out: list[t.Mount] = []
    for vm in container.volume_mounts:
        source = sources.get(vm.name)
        if source is None:
            continue
        ref = refs.get(vm.name)
        if ref is None:
            raise MountConfigError(f'image of volume "{vm.name}" ({source.reference}) is not available yet')
        if vm.sub_path_expr and env is None:
            env = _env(ctx, pod, container)
        sub = sub_path_of(vm, env or {})
        if sub:
            check_sub_path(sub)
        out.append(t.Mount(
            container_path=vm.mount_path, readonly=True, propagation=PROPAGATION[vm.mount_propagation],
            image=t.ImageSpec(image=ref, user_specified_image=source.reference,
                              annotations=dict(pod.metadata.annotations)),
            image_sub_path=sub))
    return out


def _env(ctx: PodContext, pod: Pod, container: Container) -> dict[str, str]:
    try:
        return container_env(pod, container, pod_facts(pod, node=ctx.node))
    except FieldError as exc:
        raise MountConfigError(str(exc)) from None


__all__ = ["IMAGE_VOLUME_REFS", "ensure", "ensure_for", "image_volumes", "mounting", "mounts"]
