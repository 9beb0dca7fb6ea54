"""The kubelet's restart rule (pkg/kubelet/container/helpers.go ShouldContainerBeRestarted),
shared by the stage that restarts containers and the stage that computes the pod's phase, so the
two can never disagree about whether a pod is finished."""

from __future__ import annotations

from nodeagent.runtimeview import ContainerRecord


def should_restart(policy: str, latest: ContainerRecord | None) -> bool:
    if latest is None or latest.state in ("created", "unknown"):
        return True
    if latest.running:
        return False
    if policy == "Never":
        return False
    if policy == "OnFailure":
        return latest.exit_code != 0
    return True
