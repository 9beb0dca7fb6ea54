"""Waiting, in an observe stage, for the pod's next spec (labels, annotations, ...).

The worker swaps ``ctx.pod`` for a new object each time a source reports a changed pod and
never mutates it in place (pods are frozen models), so an identity check is an exact and free
change test; looking once a second bounds the delay well inside the kubelet's own (it rewrites
volumes on its next pod sync). The PodContext contract has no spec-change notification, and
volumes are the only stages that need one.
"""

from __future__ import annotations

from nodeagent.model import Pod
from nodeagent.stages import PodContext

SPEC_POLL_SECONDS = 1.0
RESYNC_SECONDS = 60.0
"""The kubelet's pod sync period: volumes are refreshed at least this often."""


async def pod_changed(ctx: PodContext, since: Pod, timeout: float, poll: float = SPEC_POLL_SECONDS) -> bool:
    """Return True as soon as ``ctx.pod`` is another spec than ``since``, False after
    ``timeout`` seconds (on ``ctx.clock``) without one."""
    deadline = ctx.clock.monotonic() + timeout
    while ctx.pod is since:
        left = deadline - ctx.clock.monotonic()
        if left <= 0:
            return False
        await ctx.clock.sleep(min(left, poll))
    return True
