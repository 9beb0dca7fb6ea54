"""The kubelet's restart rules (pkg/kubelet/container/helpers.go), shared by the stage that
restarts containers and the stage that computes the pod's phase, so that the two can never
disagree about whether a container will run again."""

from __future__ import annotations

from nodeagent.model import Container
from nodeagent.runtimeview import ContainerRecord


def should_restart(policy: str, latest: ContainerRecord | None) -> bool:
    """ShouldContainerBeRestarted for a regular container whose newest instance is ``latest``."""
    if latest is None or latest.state in ("created", "unknown"):
        return True
    if latest.running:
        return False
    if policy == "Never":
        return False
    if policy == "OnFailure":
        return latest.exit_code != 0
    return True


def is_sidecar(container: Container) -> bool:
    """A restartable init container: started in init order, then kept running like a regular
    container whatever the pod's restartPolicy, and stopped after the regular containers."""
    return container.restart_policy == "Always"


def init_failed(record: ContainerRecord) -> bool:
    """isInitContainerFailed: a non-zero exit, an OOM kill, or a state the runtime lost."""
    if record.state == "unknown":
        return True
    return record.exited and (record.exit_code != 0 or record.reason == "OOMKilled")
