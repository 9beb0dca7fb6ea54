"""What the runtime stage has read from the runtime for one pod and need not read again.

Each value describes something that does not change while it exists: a sandbox keeps the IPs
CNI gave it for its whole life, and an image ID names immutable content (its user included).
The kubelet asks PodSandboxStatus and ImageStatus again before every container it creates;
here each is asked once per sandbox and per image, which saves two runtime calls on the path of
every container start.
"""

from __future__ import annotations

from cri import types as t
from nodeagent.stages import PodContext
from nodeagent.stash import StashKey

SANDBOX_IPS = StashKey[tuple[str, tuple[str, ...]]]("runtime.sandbox_ips")
"""(sandbox id, its IPs, the primary first) of the pod's current sandbox."""
IMAGES = StashKey[dict[str, t.Image]]("runtime.images")
"""ImageStatus by image ID of the images this pod's containers run."""


async def sandbox_ips(ctx: PodContext, sandbox_id: str) -> tuple[str, ...]:
    """The sandbox's IPs (PodSandboxStatus the first time). An answer without any IP is not
    kept, unless the pod is on the host network (which has none of its own): asked again."""
    known = ctx.stash.get(SANDBOX_IPS)
    if known is not None and known[0] == sandbox_id:
        return known[1]
    status = await ctx.runtime.pod_sandbox_status(sandbox_id)
    network = status.network
    ips = tuple(ip for ip in ([network.ip, *(a.ip for a in network.additional_ips)] if network else []) if ip)
    if ips or ctx.pod.spec.host_network:
        ctx.stash[SANDBOX_IPS] = (sandbox_id, ips)
    return ips


def note_image(ctx: PodContext, image: t.Image) -> None:
    """An ImageStatus answer read on the way (the pull policy's check)."""
    if image.id:
        ctx.stash.setdefault(IMAGES, {})[image.id] = image


async def image(ctx: PodContext, image_ref: str) -> t.Image | None:
    """ImageStatus of ``image_ref`` (asked the first time; an absent image is asked again)."""
    known = ctx.stash.setdefault(IMAGES, {})
    if image_ref in known:
        return known[image_ref]
    found = await ctx.runtime.image_status(image_ref)
    if found is not None:
        known[image_ref] = found
    return found
