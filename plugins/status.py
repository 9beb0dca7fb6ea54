"""The status stage: turns what the runtime shows into the kubelet's pod status.

Container statuses follow convertToAPIContainerStatuses (newest instance = state, the one
before = lastState), the phase follows getPhase, conditions follow status/generate.go. When the
phase is terminal (no container will run again under the restart policy) the stage tells the
worker, which then releases the sandbox.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, ClassVar

from nodeagent.model import Container, Pod
from nodeagent.runtimeview import ContainerRecord, PodRuntime
from nodeagent.stages import AgentHandle, Observe, PodContext
from nodeagent.status import rfc3339
from plugins.restartpolicy import should_restart

RESYNC_SECONDS = 10.0


def _ts(ns: int) -> str:
    return rfc3339(ns / 1e9) if ns else ""


def _state(record: ContainerRecord) -> dict[str, Any]:
    if record.running:
        return {"running": {"startedAt": _ts(record.started_at)}}
    if record.exited:
        terminated: dict[str, Any] = {
            "exitCode": record.exit_code,
            "reason": record.reason or ("Completed" if record.exit_code == 0 else "Error"),
            "startedAt": _ts(record.started_at),
            "finishedAt": _ts(record.finished_at),
            "containerID": f"containerd://{record.id}",
        }
        if record.message:
            terminated["message"] = record.message
        return {"terminated": terminated}
    return {"waiting": {"reason": "ContainerCreating"}}


def container_status(container: Container, runtime: PodRuntime) -> dict[str, Any]:
    latest = runtime.latest(container.name)
    if latest is None:
        return {"name": container.name, "image": container.image, "imageID": "", "ready": False,
                "started": False, "restartCount": 0, "state": {"waiting": {"reason": "ContainerCreating"}},
                "lastState": {}}
    previous = runtime.previous(container.name)
    return {
        "name": container.name,
        "image": container.image,
        "imageID": latest.image_ref,
        "containerID": f"containerd://{latest.id}",
        "ready": latest.running,  # no readiness probes yet: running means ready
        "started": latest.running,
        "restartCount": latest.restart_count,
        "state": _state(latest),
        "lastState": _state(previous) if previous is not None and previous.exited else {},
    }


def pod_phase(pod: Pod, runtime: PodRuntime) -> str:
    """getPhase for regular containers (pkg/kubelet/kubelet_pods.go)."""
    running = waiting = stopped = succeeded = unknown = 0
    for c in pod.spec.containers:
        latest = runtime.latest(c.name)
        if latest is None:
            unknown += 1
        elif latest.running:
            running += 1
        elif latest.exited:
            stopped += 1
            if latest.exit_code == 0:
                succeeded += 1
        else:
            waiting += 1
    if waiting:
        return "Pending"
    if running and not unknown:
        return "Running"
    if unknown:
        return "Pending"
    if stopped == len(pod.spec.containers):
        policy = pod.spec.restart_policy
        if any(should_restart(policy, runtime.latest(c.name)) for c in pod.spec.containers):
            return "Running"
        return "Succeeded" if succeeded == stopped else "Failed"
    return "Pending"


def conditions(pod: Pod, runtime: PodRuntime, statuses: list[dict[str, Any]], phase: str) -> list[dict[str, Any]]:
    now = rfc3339(time.time())
    unready = [s["name"] for s in statuses if not s["ready"]]
    sandbox = runtime.ready_sandbox() is not None

    def ready_condition(kind: str) -> dict[str, Any]:
        if phase == "Succeeded":
            return {"type": kind, "status": "False", "reason": "PodCompleted", "lastTransitionTime": now}
        if unready:
            return {"type": kind, "status": "False", "reason": "ContainersNotReady",
                    "message": f"containers with unready status: [{' '.join(unready)}]", "lastTransitionTime": now}
        return {"type": kind, "status": "True", "lastTransitionTime": now}

    return [
        {"type": "PodReadyToStartContainers", "status": "True" if sandbox else "False", "lastTransitionTime": now},
        {"type": "Initialized", "status": "True", "lastTransitionTime": now},
        ready_condition("Ready"),
        ready_condition("ContainersReady"),
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
    ]


def compute(pod: Pod, runtime: PodRuntime) -> dict[str, Any]:
    statuses = [container_status(c, runtime) for c in pod.spec.containers]
    phase = pod_phase(pod, runtime)
    sandbox = runtime.ready_sandbox() or (max(runtime.sandboxes, key=lambda s: s.created_at) if runtime.sandboxes else None)
    status: dict[str, Any] = {
        "phase": phase,
        "conditions": conditions(pod, runtime, statuses, phase),
        "containerStatuses": statuses,
    }
    if sandbox is not None and sandbox.pod_ip:
        status["podIP"] = sandbox.pod_ip
        status["podIPs"] = [{"ip": sandbox.pod_ip}]
    return status


class StatusStage(Observe):
    name: ClassVar[str] = "status"

    async def observe(self, ctx: PodContext) -> None:
        while True:
            status = compute(ctx.pod, ctx.observed)
            ctx.status.set_observed(status)
            if status["phase"] in ("Succeeded", "Failed"):
                ctx.complete(status["phase"])
                return
            await ctx.runtime_changed(timeout=RESYNC_SECONDS)


def plugin(config: Mapping[str, Any], handle: AgentHandle) -> StatusStage:
    if config:
        raise TypeError(f"status takes no configuration, got {sorted(config)}")
    return StatusStage()


plugin.stage_class = StatusStage  # type: ignore[attr-defined]
