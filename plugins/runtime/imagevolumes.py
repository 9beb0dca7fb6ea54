"""Image volumes (``volumes[].image``, KEP-4639): an OCI image the runtime mounts read-only
into the containers that mount the volume — the kubelet's getImageVolumes and makeMounts.

Each image volume's image is ensured like a container's (pull policy, the pod's pull secrets
and the node's credentials, pull back-off, pull records), before the pod's first container
starts. The runtime mounts it, not us: the container's CRI ``Mount`` names the image
(``Mount.image``, the image ID we ensured, with ``image_sub_path`` for a subPath) and no host
path; containerd 2.1+ unpacks it into a snapshot under the sandbox, mounts it once per pod and
image, binds it (or the subPath's directory, which must exist: ``ImageVolumeMountFailed``)
into the container, and removes it with the sandbox. So nothing here is ever undone by us.

A volume whose image cannot be had shows on the containers that mount it (their waiting
reason is the pull's: ErrImagePull, ImagePullBackOff, ErrImageNeverPull) and keeps prepare
retrying, so no container of the pod starts until it is there — stricter than the kubelet,
whose toKubeContainerImageVolumes holds back only the containers that mount it (ours pulls
images in prepare, before the sandbox, for containers too). A volume no container mounts is
still pulled, as the kubelet does, and its failure keeps nothing from starting.
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


async def ensure(ctx: PodContext, puller: ImagePuller, secrets: PullSecrets) -> Result | None:
    """Ensure every image volume's image (all of them, as the kubelet: one failing does not
    stop the others from being pulled). Returns the first failure of a volume some container
    mounts, as a RETRY; a failure of an unmounted volume is logged and ignored."""
    refs: dict[str, str] = {}
    problem: Result | None = None
    for volume in image_volumes(ctx.pod):
        source = volume.image
        assert source is not None
        users = mounting(ctx.pod, volume.name)
        ref, failed = await puller.ensure_image(ctx, source.reference, source.policy, users, secrets)
        if failed is None:
            refs[volume.name] = ref
        elif not users:
            ctx.log.info("image of an unmounted image volume not available", volume=volume.name,
                         image=source.reference, reason=failed.reason)
        elif problem is None:
            problem = failed
    ctx.stash[IMAGE_VOLUME_REFS] = refs
    return problem


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


__all__ = ["IMAGE_VOLUME_REFS", "ensure", "image_volumes", "mounting", "mounts"]
