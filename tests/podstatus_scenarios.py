"""Rich pod statuses, built through the status stage and the status writer as the agent does:
the inputs of tests/test_podstatus.py, whose expected JSON (tests/data/podstatus_golden.json)
was captured from the dict-based code before the status became a typed model."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nodeagent.events import PodRef
from nodeagent.kube.resize import ResizeState
from nodeagent.lifecycle import PodState
from nodeagent.model import Pod, ResourceRequirements
from nodeagent.runtimeview import ContainerRecord, PodRuntime, SandboxRecord
from nodeagent.status import StatusWriter
from plugins.status import Facts, compute

NOW = 1_790_000_000.0
SANDBOX = SandboxRecord(id="sb1", attempt=0, ready=True, created_at=1, pod_ip="10.0.0.2")


def _pod(spec: dict[str, Any], status: dict[str, Any] | None = None, generation: int = 3) -> Pod:
    return Pod.model_validate({"metadata": {"name": "p", "namespace": "ns", "uid": "u1", "generation": generation},
                               "spec": spec, "status": status or {}})


def _rec(name: str, state: str = "running", exit_code: int = 0, attempt: int = 0, kind: str = "container",
         reason: str = "", message: str = "") -> ContainerRecord:
    return ContainerRecord(id=f"{name}-{attempt}", name=name, pod_uid="u1", sandbox_id="sb1", attempt=attempt,
                           state=state, created_at=10 + attempt, restart_count=attempt, container_type=kind,
                           image="busybox", image_ref=f"sha256:{name}", started_at=(5 + attempt) * 10**9,
                           finished_at=(9 + attempt) * 10**9 if state == "exited" else 0, exit_code=exit_code,
                           reason=reason, message=message)


def _writer(pod: Pod, state: PodState) -> StatusWriter:
    writer = StatusWriter([], host_ip="192.168.1.5")
    writer.track(PodRef(uid="u1", namespace="ns", name="p"), pod)
    writer.set_state("u1", PodState.ADMITTED)
    writer.set_state("u1", state)
    return writer


RESOURCES = {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}}


def rich() -> StatusWriter:
    """Init container done, a probed sidecar, a probed main container, a crash-looping container
    with its previous instance as lastState, an ephemeral container, readiness gates (one True,
    one missing), a stage's condition, resources."""
    pod = _pod({
        "restartPolicy": "Always",
        "readinessGates": [{"conditionType": "example.com/lb"}, {"conditionType": "example.com/missing"}],
        "initContainers": [{"name": "init", "image": "busybox"},
                           {"name": "side", "image": "busybox", "restartPolicy": "Always",
                            "readinessProbe": {"exec": {"command": ["true"]}}}],
        "containers": [{"name": "main", "image": "busybox", "resources": RESOURCES,
                        "readinessProbe": {"exec": {"command": ["true"]}},
                        "startupProbe": {"exec": {"command": ["true"]}}},
                       {"name": "crash", "image": "busybox"}],
        "ephemeralContainers": [{"name": "debug", "image": "busybox"}],
    }, status={"conditions": [{"type": "example.com/lb", "status": "True"}]})
    runtime = PodRuntime(uid="u1", sandboxes=(SANDBOX,), containers=(
        _rec("init", "exited", kind="init"), _rec("side", kind="init"), _rec("main"),
        _rec("crash", "exited", 2, attempt=0, message="boom"), _rec("crash", "exited", 1, attempt=1, reason="Error"),
        _rec("debug")))
    writer = _writer(pod, PodState.RUNNING)
    reporter = writer.reporter("u1")
    reporter.set_observed(compute(pod, runtime, Facts(now=NOW, node_ip="192.168.1.5",
                                                      messages={"crash-1": "out of luck"})))
    reporter.container_waiting("crash", "CrashLoopBackOff", "back-off 10s restarting failed container=crash")
    reporter.container_probe_result("main", ready=True, started=True)
    reporter.container_probe_result("side", ready=False)
    reporter.set_condition("nodeagent.io/example", True, "Because", "it says so")
    return writer


def gates_ready() -> StatusWriter:
    """Every container ready and the one gate True: Ready."""
    pod = _pod({"readinessGates": [{"conditionType": "example.com/lb"}],
                "containers": [{"name": "main", "image": "busybox",
                                "readinessProbe": {"exec": {"command": ["true"]}}}]},
               status={"conditions": [{"type": "example.com/lb", "status": "True"}]})
    writer = _writer(pod, PodState.RUNNING)
    writer.reporter("u1").set_observed(compute(pod, PodRuntime(uid="u1", sandboxes=(SANDBOX,),
                                                               containers=(_rec("main"),)), Facts(now=NOW)))
    writer.reporter("u1").container_probe_result("main", ready=True)
    return writer


def rejected() -> StatusWriter:
    pod = _pod({"containers": [{"name": "c", "image": "busybox"}]})
    writer = StatusWriter([], host_ip="192.168.1.5")
    writer.track(PodRef(uid="u1", namespace="ns", name="p"), pod)
    writer.reporter("u1").set_pod_reason("TaintToleration", "Predicate TaintToleration failed")
    writer.set_state("u1", PodState.REJECTED)
    return writer


def pending() -> StatusWriter:
    """Nothing observed yet: statuses from the spec, one waiting for its image."""
    pod = _pod({"initContainers": [{"name": "init", "image": "busybox"}],
                "containers": [{"name": "main", "image": "busybox"}, {"name": "other", "image": "nginx"}]})
    writer = _writer(pod, PodState.PREPARING)
    writer.reporter("u1").container_waiting("main", "ErrImagePull", "pull failed")
    writer.reporter("u1").set_pod_reason("Preparing")
    return writer


def succeeded() -> StatusWriter:
    """A Never pod done: terminated with lastState of nothing, host network, stopping."""
    pod = _pod({"restartPolicy": "Never", "hostNetwork": True,
                "containers": [{"name": "main", "image": "busybox"}]})
    writer = _writer(pod, PodState.TERMINATING)
    writer.reporter("u1").set_observed(compute(pod, PodRuntime(uid="u1", sandboxes=(SANDBOX,), containers=(
        _rec("main", "exited"),)), Facts(now=NOW, node_ip="192.168.1.5")))
    writer.reporter("u1").set_pod_reason("Evicted", "The node was low on resource: memory.")
    return writer


def failed() -> StatusWriter:
    """A stage failed the pod as a whole; the restart of a container was reported waiting."""
    pod = _pod({"restartPolicy": "OnFailure", "containers": [{"name": "main", "image": "busybox"}]})
    writer = _writer(pod, PodState.RUNNING)
    writer.reporter("u1").set_observed(compute(pod, PodRuntime(uid="u1", sandboxes=(SANDBOX,), containers=(
        _rec("main", "exited", 3), _rec("main", "running", attempt=1))), Facts(now=NOW)))
    writer.fail("u1", "DeadlineExceeded", "Pod was active on the node longer than the specified deadline")
    return writer


def resizing() -> StatusWriter:
    """Pod-level resources and a resize pending and in progress (observedGeneration)."""
    pod = _pod({"resources": {"requests": {"cpu": "200m"}, "limits": {"cpu": "400m", "memory": "256Mi"}},
                "containers": [{"name": "main", "image": "busybox", "resources": RESOURCES}]}, generation=5)
    state = ResizeState(generation=4, containers={"main": ResourceRequirements.model_validate(RESOURCES)},
                        pod=pod.spec.resources, observed_generation=5, pending=("Deferred", "not now"),
                        in_progress=("", ""))
    writer = _writer(pod, PodState.RUNNING)
    writer.reporter("u1").set_observed(compute(pod, PodRuntime(uid="u1", sandboxes=(SANDBOX,), containers=(
        _rec("main"),)), Facts(now=NOW, resize=state)))
    return writer


SCENARIOS: dict[str, Callable[[], StatusWriter]] = {
    "rich": rich, "gates_ready": gates_ready, "rejected": rejected, "pending": pending,
    "succeeded": succeeded, "failed": failed, "resizing": resizing,
}
