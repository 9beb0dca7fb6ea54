"""The kubelet's restart rules (pkg/kubelet/container/helpers.go), shared by the stage that
restarts containers and the stage that computes the pod's phase, so that the two can never
disagree about whether a container will run again."""

from __future__ import annotations

from nodeagent.model import Container, ContainerRestartRule, Pod, PodSpec
from nodeagent.runtimeview import ContainerRecord, PodRuntime


def unstarted_sidecars(spec: PodSpec, running_ids: dict[str, str], passed: set[str]) -> frozenset[str]:
    """Ids of running sidecars (``running_ids``: name → id) whose startup probe has not passed
    (``passed``: the instances whose startup probe succeeded, nodeagent.podfacts.STARTUP_PASSED)."""
    return frozenset(cid for c in spec.init_containers
                     if is_sidecar(c) and c.startup_probe is not None
                     and (cid := running_ids.get(c.name)) is not None and cid not in passed)


def container_should_restart(spec: PodSpec, container: Container, exit_code: int) -> bool:
    """ContainerShouldRestart (ContainerRestartRules, on by default since v1.35): the
    container's rules in order (the first whose exit codes match decides), then the
    container's restartPolicy, then the pod's."""
    if container.restart_policy is not None:
        if matching_rule(container, exit_code) is not None:
            return True  # Restart, or RestartAllContainers (which restarts this one too)
        policy = container.restart_policy
    else:
        policy = spec.restart_policy
    if policy == "Never":
        return False
    if policy == "OnFailure":
        return exit_code != 0
    return True


def matching_rule(container: Container, exit_code: int) -> ContainerRestartRule | None:
    """FindMatchingContainerRestartRule: the first rule whose exit codes match."""
    for rule in container.restart_policy_rules:
        if rule.exit_codes is not None and (exit_code in rule.exit_codes.values) == (rule.exit_codes.operator == "In"):
            return rule
    return None


def should_restart(spec: PodSpec, container: Container, latest: ContainerRecord | None) -> bool:
    """ShouldContainerBeRestarted for a regular container whose newest instance is ``latest``."""
    if latest is None or latest.state in ("created", "unknown"):
        return True
    if latest.running:
        return False
    return container_should_restart(spec, container, latest.exit_code)


def is_sidecar(container: Container) -> bool:
    """(For an init container) A restartable init container: started in init order, then kept running like a regular
    container whatever the pod's restartPolicy, and stopped after the regular containers."""
    return container.restart_policy == "Always"


def init_failed(record: ContainerRecord) -> bool:
    """isInitContainerFailed: a non-zero exit, an OOM kill, or a state the runtime lost."""
    if record.state == "unknown":
        return True
    return record.exited and (record.exit_code != 0 or record.reason == "OOMKilled")


def awaiting_rerun(pod: Pod, runtime: PodRuntime, since: int) -> bool:
    """(RestartAllContainers) Reset at ``since``, and some container has not run again since:
    the pod is not finished, whatever its stopped instances say."""
    if not since:
        return False
    return any((latest := runtime.latest(c.name)) is not None and latest.created_at <= since
               for c in pod.all_containers())
