"""What the runtime stage has read from the runtime for one pod and need not read again.

Each value describes something that does not change while it exists: a sandbox keeps the IPs
CNI gave it for its whole life, and an image ID names immutable content (its user included).
The kubelet asks PodSandboxStatus and ImageStatus again before every container it creates;
here each is asked once per sandbox and per image, which saves two runtime calls on the path of
every container start.
"""

from __future__ import annotations

import anyio

from cri import types as t
from nodeagent import runtimeview
from nodeagent.stages import PodContext
from nodeagent.stash import StashKey

RECORD_WAIT_SECONDS = 1.0
"""How long a sandbox's IPs are waited for in the relister's record before PodSandboxStatus is
asked: the event or listing that brings them normally lands within milliseconds of RunPodSandbox's
answer; the bound keeps a runtime whose event went missing from holding the pod up for long."""

SANDBOX_IPS = StashKey[tuple[str, tuple[str, ...]]]("runtime.sandbox_ips")
"""(sandbox id, its IPs, the primary first) of the pod's current sandbox."""
IMAGES = StashKey[dict[str, t.Image]]("runtime.images")
"""ImageStatus by image ID of the images this pod's containers run."""


async def sandbox_ips(ctx: PodContext, sandbox_id: str) -> tuple[str, ...]:
    """The sandbox's IPs: the relister's record of it when that has them (the sandbox's start
    event carries its status, IPs included, on a runtime that streams events; a listing asks
    PodSandboxStatus for a new sandbox itself), else PodSandboxStatus. An answer without any IP
    is not kept, unless the pod is on the host network (which has none of its own): asked again.

    A sandbox this stage just ran is not in the record yet for a moment: its event (or the
    listing its expectation asked for) is on its way, and is waited for, up to
    RECORD_WAIT_SECONDS, instead of asking the runtime the same thing a second time."""
    known = ctx.stash.get(SANDBOX_IPS)
    if known is not None and known[0] == sandbox_id:
        return known[1]
    ips = await _recorded_ips(ctx, sandbox_id)
    if ips is None:
        ips = runtimeview.sandbox_ips(await ctx.runtime.pod_sandbox_status(sandbox_id))
    if ips or ctx.pod.spec.host_network:
        ctx.stash[SANDBOX_IPS] = (sandbox_id, ips)
    return ips


async def _recorded_ips(ctx: PodContext, sandbox_id: str) -> tuple[str, ...] | None:
    """The IPs in the relister's record of the sandbox; None when it has none within the wait."""
    if ctx.pod.spec.host_network:
        return None  # the record cannot tell "no IP of its own" from "not known yet"
    with anyio.move_on_after(RECORD_WAIT_SECONDS):
        while True:
            record = next((sb for sb in ctx.observed.sandboxes if sb.id == sandbox_id), None)
            if record is not None and record.pod_ips:
                return record.pod_ips
            if record is not None and not record.ready:
                return None  # stopped already: the runtime's answer, whatever it is
            await ctx.runtime_changed(timeout=RECORD_WAIT_SECONDS)
    return None


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
