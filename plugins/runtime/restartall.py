"""RestartAllContainers, the second action of ContainerRestartRules (beta, on by default since
v1.36): a container whose exit code matches such a rule restarts the whole pod in place --
every running container is stopped, then the init containers run again from the first, then
the sidecars and the regular containers, in the same sandbox (kuberuntime_manager.go).

The kubelet removes every container to start over; we keep the dead instances (they are the
status's lastState, and their attempt numbers make the restart counts go on) and remember when
the pod was reset: instances created before that no longer count as this sandbox's progress
(plan.py's ``since``), and the status does not call the pod finished meanwhile."""

from __future__ import annotations

import time

from nodeagent.facts import FactAccess
from nodeagent.kube.restartpolicy import matching_rule
from nodeagent.model import Pod
from nodeagent.podfacts import RESTART_ALL_AT
from nodeagent.runtimeview import ContainerRecord, PodRuntime

REASON = "RestartAllContainers"


def reset_at(facts: FactAccess) -> int:
    """When the pod was last reset (ns, the runtime's clock for created_at); 0: never."""
    return facts.get(RESTART_ALL_AT) or 0


def trigger(pod: Pod, runtime: PodRuntime, since: int) -> ContainerRecord | None:
    """The exited instance (made after the last reset) whose exit code matches a
    RestartAllContainers rule of its container, if any."""
    for container in pod.all_containers():
        latest = runtime.latest(container.name)
        if latest is None or not latest.exited or latest.created_at <= since:
            continue
        rule = matching_rule(container, latest.exit_code) if container.restart_policy is not None else None
        if rule is not None and rule.action == "RestartAllContainers":
            return latest
    return None


def begin(facts: FactAccess) -> None:
    facts.set(RESTART_ALL_AT, time.time_ns())
