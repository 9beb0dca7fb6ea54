"""spec.activeDeadlineSeconds: a pod active on the node longer than its deadline fails as a
whole with the kubelet's reason DeadlineExceeded (pkg/kubelet/active_deadline.go).

The deadline counts from the pod's start on this node (status.startTime: the API's copy when
the pod already has one, e.g. after an agent restart, else when this stage first saw it run).
The field may be set or lowered while the pod runs (the API allows both), so the stage looks
at the latest spec at least every RECHECK_SECONDS."""

from __future__ import annotations

from typing import ClassVar

from nodeagent.pluginconfig import NoConfig
from nodeagent.stages import AgentHandle, Observe, PodContext
from nodeagent.stash import StashKey
from nodeagent.status import parse_rfc3339

REASON = "DeadlineExceeded"
MESSAGE = "Pod was active on the node longer than the specified deadline"
RECHECK_SECONDS = 2.0
_STARTED: StashKey[float] = StashKey("activedeadline.started")


class ActiveDeadlineStage(Observe):
    name: ClassVar[str] = "activedeadline"

    async def observe(self, ctx: PodContext) -> None:
        clock = ctx.clock
        started = ctx.stash.setdefault(_STARTED, parse_rfc3339(ctx.pod.status.get("startTime")) or clock.now())
        while True:
            deadline = ctx.pod.spec.active_deadline_seconds
            if deadline is not None:
                left = started + deadline - clock.now()
                if left <= 0:
                    ctx.fail(REASON, MESSAGE)
                    return
                await clock.sleep(min(left, RECHECK_SECONDS))
            else:
                await clock.sleep(RECHECK_SECONDS)


def plugin(config: NoConfig, handle: AgentHandle) -> ActiveDeadlineStage:
    return ActiveDeadlineStage()


plugin.stage_class = ActiveDeadlineStage  # type: ignore[attr-defined]
plugin.config_model = NoConfig  # type: ignore[attr-defined]
