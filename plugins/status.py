"""The status stage: turns what the runtime shows into the kubelet's pod status.

Container statuses follow convertToAPIContainerStatuses (newest instance = state, the one
before = lastState, termination messages read from the instance's message file or log), the
phase follows getPhase (init containers and sidecars included), conditions follow
status/generate.go. When the phase is terminal (no container will run again under the restart
policy) the stage tells the worker, which then releases the sandbox.

Waiting reasons the runtime stage reports (CrashLoopBackOff, CreateContainerError, ...) are laid
over these statuses by the status writer, which moves a terminated state to lastState as the
kubelet does. The status is a typed model (nodeagent.podstatus) until the writer hands it to the
sinks.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import anyio
from pydantic import ValidationError

from cri import CriError
from nodeagent.kube.resize import (
    RESIZE_IN_PROGRESS,
    RESIZE_PENDING,
    ResizeState,
    status_resources,
    with_resources,
)
from nodeagent.kube.resources import FIT_RESOURCES, pod_requests
from nodeagent.kube.restartpolicy import (
    awaiting_rerun,
    container_should_restart,
    is_sidecar,
    should_restart,
)
from nodeagent.model import Container, Pod
from nodeagent.pluginconfig import NoConfig
from nodeagent.podfacts import RESIZE, RESTART_ALL_AT, RUNTIME_NOTES, RuntimeNotes
from nodeagent.podstatus import (
    ConditionStatus,
    ContainerState,
    ContainerStateRunning,
    ContainerStateTerminated,
    ContainerStateWaiting,
    ContainerStatus,
    PodCondition,
    PodIP,
    PodPhase,
    PodStatus,
    ResourceStatus,
    VolumeMountStatus,
)
from nodeagent.runtimeview import ContainerRecord, PodRuntime
from nodeagent.stages import AgentHandle, Observe, PodContext
from nodeagent.stash import StashKey
from nodeagent.status import rfc3339
from nodeagent.terminationmessage import MAX_POD_MESSAGE_BYTES, read_message
from nodeagent.waits import first_of

RESYNC_SECONDS = 10.0

MESSAGES = StashKey[dict[str, str]]("status.termination_messages")


@dataclass(frozen=True)
class Facts:
    """What the status is computed from besides the spec and the runtime records."""

    messages: Mapping[str, str] = field(default_factory=dict)
    """Termination message per exited container id."""
    post_start_running: frozenset[str] = frozenset()
    """Container ids still in their postStart hook: running, not yet started."""
    node_ip: str = ""
    now: float = 0.0
    """When this status is computed: a condition's lastTransitionTime until the status writer,
    which knows what was published before, keeps an earlier one (nodeagent/status.py)."""
    resize: ResizeState | None = None
    """Allocated and applied resources, resize conditions (plugins/runtime/resize.py)."""
    reset_at: int = 0
    """When the pod was last restarted as a whole (the fact RESTART_ALL_AT), ns."""
    recursive_read_only: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """Container name -> mount paths its latest instance got recursively read-only."""


def _ts(ns: int) -> str:
    return rfc3339(ns / 1e9) if ns else ""


def _state(record: ContainerRecord, facts: Facts, limit: int, waiting: str = "ContainerCreating") -> ContainerState:
    if record.running:
        return ContainerState(running=ContainerStateRunning(started_at=_ts(record.started_at)))
    if record.exited:
        message = facts.messages.get(record.id, record.message)
        return ContainerState(terminated=ContainerStateTerminated(
            exit_code=record.exit_code,
            reason=record.reason or ("Completed" if record.exit_code == 0 else "Error"),
            # The status manager's per-pod budget, split evenly across containers.
            message=message.encode()[:limit].decode(errors="ignore") if message else None,
            started_at=_ts(record.started_at),
            finished_at=_ts(record.finished_at),
            container_id=f"containerd://{record.id}",
        ))
    # Created but not started yet (StartContainer in flight): the kubelet never publishes this
    # moment, since it creates and starts within one sync; show the reason it showed before.
    return ContainerState(waiting=ContainerStateWaiting(reason=waiting))


def _instances(runtime: PodRuntime, name: str) -> list[ContainerRecord]:
    return sorted((c for c in runtime.containers if c.name == name), key=lambda c: (c.attempt, c.created_at),
                  reverse=True)


def container_status(pod: Pod, container: Container, runtime: PodRuntime, facts: Facts, *,
                     init: bool = False, limit: int = MAX_POD_MESSAGE_BYTES) -> ContainerStatus:
    instances = _instances(runtime, container.name)
    if len(instances) > 1 and instances[0].state == "created" and instances[1].exited:
        # A restart created but not started yet. The kubelet computes a status before its sync
        # creates and starts, so it never shows this moment; shown, it pairs the new restart count
        # with the old instance as lastState (the back-off test reads a negative restart delay).
        # Until StartContainer returns, the previous instance stays the current one.
        instances = instances[1:]
    if not instances:
        reason = "PodInitializing" if pod.spec.init_containers else "ContainerCreating"
        return ContainerStatus(name=container.name, image=container.image, image_id="", ready=False, started=False,
                               restart_count=0, state=ContainerState(waiting=ContainerStateWaiting(reason=reason)),
                               last_state=ContainerState(), volume_mounts=volume_mounts(container, facts))
    latest = instances[0]
    previous = instances[1] if len(instances) > 1 else None
    started = latest.running and latest.id not in facts.post_start_running
    if init and not is_sidecar(container):
        ready = latest.exited and latest.exit_code == 0  # a regular init container is ready when done
    else:
        ready = started  # readiness probes refine this in the status writer
    if facts.resize is not None and latest.exited and latest.id in facts.resize.restarting:
        # Killed for a resize and about to start again: the kubelet kills and starts within one
        # sync and never shows this instance as current. Neither may we: the API server refuses
        # a terminated state (exit 0 under OnFailure) that later turns running again.
        resources, allocated = _resources(container, latest, facts)
        return ContainerStatus(name=container.name, image=container.image, image_id=latest.image_ref,
                               container_id=f"containerd://{latest.id}", ready=False, started=False,
                               restart_count=latest.restart_count + 1,
                               state=ContainerState(waiting=ContainerStateWaiting(reason="ContainerCreating")),
                               last_state=_state(latest, facts, limit), resources=resources,
                               allocated_resources=allocated, volume_mounts=volume_mounts(container, facts))
    resources, allocated = _resources(container, latest, facts)
    return ContainerStatus(
        name=container.name,
        image=container.image,
        image_id=latest.image_ref,
        container_id=f"containerd://{latest.id}",
        ready=ready,
        started=started,
        restart_count=latest.restart_count,
        state=_state(latest, facts, limit, "PodInitializing" if pod.spec.init_containers else "ContainerCreating"),
        last_state=_state(previous, facts, limit) if previous is not None and previous.exited else ContainerState(),
        resources=resources,
        allocated_resources=allocated,
        volume_mounts=volume_mounts(container, facts),
    )


def volume_mounts(container: Container, facts: Facts) -> list[VolumeMountStatus] | None:
    """status.volumeMounts, as the kubelet's RecursiveReadOnlyMounts (GA) reports them: every
    spec mount, a read-only one with its recursive mode as the runtime stage resolved it."""
    if not container.volume_mounts:
        return None
    made = facts.recursive_read_only.get(container.name, frozenset())
    return [VolumeMountStatus(name=m.name, mount_path=m.mount_path, read_only=True if m.read_only else None,
                              recursive_read_only=("Enabled" if m.mount_path in made else "Disabled")
                              if m.read_only else None)
            for m in container.volume_mounts]


def _resources(container: Container, latest: ContainerRecord,
               facts: Facts) -> tuple[ResourceStatus, dict[str, str] | None]:
    """resources (what the instance runs with, the allocation when it does not run) and
    allocatedResources (the allocated requests), as convertContainerStatusResources."""
    state = facts.resize
    allocated = state.containers.get(container.name, container.resources) if state else container.resources
    applied = state.applied.get(latest.id) if state is not None and latest.running else None
    resources = ResourceStatus.model_validate(status_resources(applied[0] if applied is not None else allocated))
    return resources, {k: str(v) for k, v in allocated.requests.items()} if allocated.requests else None


def pod_level_resources(pod: Pod, state: ResizeState | None) -> tuple[ResourceStatus | None, dict[str, str] | None]:
    """status.allocatedResources (PodRequests of the allocated pod: the containers' requests
    summed, pod-level requests winning) and, for a pod with pod-level resources, status.resources
    (convertToAPIPodLevelResourcesStatus: the pod cgroup holds the allocated values; a pod-level
    spec without a memory request shows the containers' sum)."""
    pod_level = state.pod if state is not None else pod.spec.resources
    allocated = with_resources(pod, state.containers, pod_level) if state is not None else pod
    summed = pod_requests(allocated)
    totals: dict[str, str] = {}
    for c in allocated.spec.containers:
        for k, v in c.resources.requests.items():
            if k not in FIT_RESOURCES:
                totals[k] = str(v)
    for k, v in summed.items():
        totals[k] = f"{v}m" if k == "cpu" else str(v)
    out: ResourceStatus | None = None
    if pod_level is not None:
        for k, v in pod_level.requests.items():
            totals[k] = str(v)
        # What the pod cgroup holds: the allocation until an actuation failed part-way.
        applied = state.pod_applied if state is not None and state.pod_cgroup is not None else pod_level
        resources = status_resources(applied or pod_level)
        requests = resources.setdefault("requests", {})
        if "memory" not in requests and summed.get("memory"):
            requests["memory"] = str(summed["memory"])
        if not requests:
            resources.pop("requests")
        out = ResourceStatus.model_validate(resources)
    return out, totals or None


def resize_conditions(state: ResizeState | None, facts: Facts) -> list[PodCondition]:
    """PodResizePending (Infeasible / Deferred) and PodResizeInProgress (reason Error when the
    actuation failed), as the status manager keeps them."""
    if state is None:
        return []
    found = []
    for kind, value in ((RESIZE_PENDING, state.pending), (RESIZE_IN_PROGRESS, state.in_progress)):
        if value is None:
            continue
        condition = _condition(kind, True, facts, *value)
        found.append(condition.model_copy(update={"observed_generation": state.observed_generation}))
    return found


def pod_phase(pod: Pod, init_statuses: Sequence[ContainerStatus], statuses: Sequence[ContainerStatus],
              initialized_before: bool) -> PodPhase:
    """getPhase (pkg/kubelet/kubelet_pods.go) for a static pod: terminal only when the restart
    policy says no container runs again. Sidecars count while they run and never decide the
    outcome."""
    spec = pod.spec
    by_name = {s.name: s for s in (*init_statuses, *statuses)}
    pending_init = pending_sidecars = failed_init = 0
    unknown = running = waiting = stopped = succeeded = final = 0
    for c in spec.init_containers:
        s = by_name.get(c.name)
        state = s.state if s is not None else ContainerState()
        last = s.last_state.terminated if s is not None else None
        if is_sidecar(c):
            if s is None:
                unknown += 1
            elif state.running is not None:
                running += 1
                if not s.started:
                    pending_sidecars += 1
            elif state.terminated is not None:
                pass
            elif state.waiting is not None and last is None:
                pending_sidecars += 1
                waiting += 1
            elif state.waiting is None:
                pending_sidecars += 1
                unknown += 1
            continue
        if s is None or state.running is not None:
            pending_init += 1
        elif (terminated := state.terminated or last) is not None:
            # Failed for good: a non-zero exit its restart policy does not restart (per
            # container with ContainerRestartRules; the pod's policy otherwise).
            code = terminated.exit_code
            failed_init += code != 0 and not container_should_restart(spec, c, code)
        else:
            pending_init += 1
    for c in spec.containers:
        s = by_name.get(c.name)
        state = s.state if s is not None else ContainerState()
        last = s.last_state.terminated if s is not None else None
        if s is None:
            unknown += 1
        elif state.running is not None:
            running += 1
        elif state.terminated is not None:
            stopped += 1
            succeeded += state.terminated.exit_code == 0
            final += not container_should_restart(spec, c, state.terminated.exit_code)
        elif last is not None:
            stopped += 1
            final += not container_should_restart(spec, c, last.exit_code)
        else:
            waiting += 1
    if failed_init:
        return "Failed"
    if pending_init or (pending_sidecars and not initialized_before) or waiting:
        return "Pending"
    if running and not unknown:
        return "Running"
    if not running and stopped and not unknown:
        # Per container (ContainerRestartRules): one that will run again keeps the pod Running.
        if stopped != final:
            return "Running"
        return "Succeeded" if stopped == succeeded else "Failed"
    return "Pending"


def _condition(kind: str, ok: bool, facts: Facts, reason: str = "", message: str = "") -> PodCondition:
    status: ConditionStatus = "True" if ok else "False"
    return PodCondition(type=kind, status=status, reason=reason or None, message=message or None,
                        last_transition_time=rfc3339(facts.now))


def conditions(pod: Pod, runtime: PodRuntime, init_statuses: Sequence[ContainerStatus],
               statuses: Sequence[ContainerStatus], phase: PodPhase, facts: Facts) -> list[PodCondition]:
    """status/generate.go, in the kubelet's order."""
    sandbox = runtime.newest_sandbox()
    sandbox_ok = sandbox is not None and sandbox.ready and (bool(sandbox.pod_ip) or pod.spec.host_network)
    by_name = {s.name: s for s in (*init_statuses, *statuses)}

    # Initialized
    incomplete = []
    for c in pod.spec.init_containers:
        s = by_name[c.name]
        if is_sidecar(c):
            if not s.started:
                incomplete.append(c.name)
        elif s.state.terminated is None or s.state.terminated.exit_code != 0:
            incomplete.append(c.name)
    regular_started = any(by_name[c.name].state.running is not None or by_name[c.name].state.terminated is not None
                          for c in pod.spec.containers)
    if phase == "Succeeded":
        initialized = _condition("Initialized", True, facts, "PodCompleted")
    elif regular_started or not incomplete:
        initialized = _condition("Initialized", True, facts)
    else:
        initialized = _condition("Initialized", False, facts, "ContainersNotInitialized",
                                 f"containers with incomplete status: [{' '.join(incomplete)}]")

    # ContainersReady and Ready (readiness gates need an API server: not modelled)
    unready = [c.name for c in pod.spec.init_containers if is_sidecar(c) and not by_name[c.name].ready]
    unready += [c.name for c in pod.spec.containers if not by_name[c.name].ready]
    if phase in ("Succeeded", "Failed"):
        reason = "PodCompleted" if phase == "Succeeded" else "PodFailed"
        ready = [_condition(kind, False, facts, reason) for kind in ("Ready", "ContainersReady")]
    elif unready:
        message = f"containers with unready status: [{' '.join(unready)}]"
        ready = [_condition(kind, False, facts, "ContainersNotReady", message) for kind in ("Ready", "ContainersReady")]
    else:
        ready = [_condition(kind, True, facts) for kind in ("Ready", "ContainersReady")]
    return [
        _condition("PodReadyToStartContainers", sandbox_ok, facts),
        initialized,
        *ready,
        _condition("PodScheduled", True, facts),
    ]


def compute(pod: Pod, runtime: PodRuntime, facts: Facts | None = None) -> PodStatus:
    facts = facts or Facts(now=time.time())
    count = len(pod.spec.init_containers) + len(pod.spec.containers)
    limit = MAX_POD_MESSAGE_BYTES // max(count, 1)
    init_statuses = [container_status(pod, c, runtime, facts, init=True, limit=limit) for c in pod.spec.init_containers]
    statuses = [container_status(pod, c, runtime, facts, limit=limit) for c in pod.spec.containers]
    sandbox = runtime.newest_sandbox()
    here = runtime.latest_in(sandbox.id) if sandbox is not None else {}
    initialized_before = any(c.name in here and here[c.name].started_at for c in pod.spec.containers)
    phase = pod_phase(pod, init_statuses, statuses, initialized_before)
    if phase in ("Succeeded", "Failed") and awaiting_rerun(pod, runtime, facts.reset_at):
        phase = "Running"  # stopped to run again from the start (the kubelet's RestartingAllContainers)
    ready = runtime.ready_sandbox()
    shown = ready or sandbox
    pod_ip = facts.node_ip if pod.spec.host_network else (shown.pod_ip if shown is not None else "")
    resources, allocated = pod_level_resources(pod, facts.resize)
    return PodStatus(
        phase=phase,
        conditions=[*conditions(pod, runtime, init_statuses, statuses, phase, facts),
                    *resize_conditions(facts.resize, facts)],
        init_container_statuses=init_statuses or None,
        container_statuses=statuses,
        # Reported, never counted: they decide neither the phase nor readiness.
        ephemeral_container_statuses=[container_status(pod, c, runtime, facts, limit=limit)
                                      for c in pod.spec.ephemeral_containers] or None,
        # The generation the node acted on: its resources allocated, or its resize found pending.
        observed_generation=(facts.resize.observed_generation if facts.resize is not None
                             else pod.metadata.generation),
        resources=resources,
        allocated_resources=allocated,
        pod_ip=pod_ip or None,
        pod_ips=[PodIP(ip=pod_ip)] if pod_ip else None,
    )


def settled(pod: Pod, runtime: PodRuntime, phase: PodPhase | None) -> list[str]:
    """Containers whose newest instance exited and will not be restarted."""
    names = []
    regular = {c.name for c in pod.spec.containers}
    for c in pod.all_containers():
        latest = runtime.latest(c.name)
        if latest is None or not latest.exited:
            continue
        if c.name in regular:
            final = not should_restart(pod.spec, c, latest)
        else:
            final = not is_sidecar(c) and latest.exit_code == 0
        if final or phase in ("Succeeded", "Failed"):
            names.append(c.name)
    return names


async def _read_messages(ctx: PodContext, runtime: PodRuntime) -> dict[str, str]:
    """Termination messages of exited instances, read once per instance (ContainerStatus gives
    the message file's mount and the log path)."""
    cache = ctx.stash.setdefault(MESSAGES, {})
    present = {c.id for c in runtime.containers}
    for gone in set(cache) - present:
        del cache[gone]
    for record in runtime.containers:
        if record.exited and record.id not in cache:
            try:
                status = await ctx.runtime.container_status(record.id)
            except CriError:
                continue  # removed meanwhile; nothing to show
            cache[record.id] = await anyio.to_thread.run_sync(read_message, status, ctx.pod_dir)
    return cache


class StatusStage(Observe):
    name: ClassVar[str] = "status"
    # A terminating pod's status keeps following the runtime (containers stopping, readiness).
    through_termination: ClassVar[bool] = True
    uses = (RUNTIME_NOTES, RESIZE, RESTART_ALL_AT)

    async def observe(self, ctx: PodContext) -> None:
        # The runtime stage made its notes in prepare; without that stage nothing ever notes.
        notes = ctx.facts.get(RUNTIME_NOTES) or RuntimeNotes()
        # Before this stage reported anything: the status the API holds (the kubelet's
        # oldPodStatus falls back to pod.Status when its status manager has none, as after a
        # restart of the agent), so that a lastState the container GC took since is kept.
        before: PodStatus | None = reported_before(ctx.pod.status)
        while True:
            changed = notes.changed
            runtime = ctx.observed
            facts = Facts(messages=await _read_messages(ctx, runtime),
                          post_start_running=frozenset(notes.post_start_running),
                          recursive_read_only=dict(notes.recursive_read_only),
                          node_ip=ctx.node.ip, now=time.time(),
                          resize=ctx.facts.get(RESIZE), reset_at=ctx.facts.get(RESTART_ALL_AT) or 0)
            status = carry_last_states(compute(ctx.pod, runtime, facts), before)
            before = status
            for name in settled(ctx.pod, runtime, status.phase):
                # A waiting reason (RunContainerError, ...) only shows while the container is to
                # be restarted; otherwise its terminated state does (convertToAPIContainerStatuses).
                ctx.status.clear_container_waiting(name)
            ctx.status.set_observed(status)
            if status.phase == "Succeeded" or status.phase == "Failed":
                ctx.complete(status.phase)
                return
            await _changed(ctx, changed)


def carry_last_states(status: PodStatus, before: PodStatus | None) -> PodStatus:
    """lastState where the runtime no longer has the instance before: the kubelet (with
    RestartAllContainersOnContainerExits, beta and on in 1.37) takes it from the status it
    reported before (convertContainerStatus): that status's terminated state when the container
    ID changed since, else its lastState. The runtime's own previous instance still wins; this
    covers an instance the container GC removed (one dead instance per container is kept, and
    it may already be the newest) or a restart of all containers."""
    if before is None:
        return status
    old = {cs.name: cs for cs in [*(before.init_container_statuses or []), *(before.container_statuses or [])]}

    def carried(statuses: list[ContainerStatus] | None) -> list[ContainerStatus] | None:
        if statuses is None:
            return None
        out = []
        for cs in statuses:
            prior = old.get(cs.name)
            if cs.last_state.terminated is None and prior is not None and cs.container_id is not None:
                replaced = prior.container_id != cs.container_id and prior.state.terminated is not None
                terminated = prior.state.terminated if replaced else prior.last_state.terminated
                if terminated is not None:
                    cs = cs.model_copy(update={"last_state": ContainerState(terminated=terminated)})
            out.append(cs)
        return out

    return status.model_copy(update={"init_container_statuses": carried(status.init_container_statuses),
                                     "container_statuses": carried(status.container_statuses)})


_TERMINATED_FIELDS = ("exitCode", "reason", "message", "startedAt", "finishedAt", "containerID")
"""What carry_last_states carries of a terminated state (the API's has ``signal`` too; the
agent never writes it)."""


def reported_before(status: Mapping[str, Any]) -> PodStatus | None:
    """A pod's status as the API holds it, as far as carry_last_states reads it (each container's
    name, ID, terminated state and last terminated state); None when it has no container status.
    An entry that does not parse is left out: it carries nothing."""

    def terminated(state: Any) -> ContainerState:
        found = state.get("terminated") if isinstance(state, Mapping) else None
        if not isinstance(found, Mapping):
            return ContainerState()
        return ContainerState(terminated=ContainerStateTerminated.model_validate(
            {k: found[k] for k in _TERMINATED_FIELDS if k in found}))

    def entries(key: str) -> list[ContainerStatus] | None:
        out = []
        for entry in status.get(key) or ():
            try:
                out.append(ContainerStatus(name=entry["name"], image="", image_id="", ready=False, restart_count=0,
                                           container_id=entry.get("containerID"),
                                           state=terminated(entry.get("state")),
                                           last_state=terminated(entry.get("lastState"))))
            except (KeyError, TypeError, AttributeError, ValidationError):
                continue
        return out or None

    init, regular = entries("initContainerStatuses"), entries("containerStatuses")
    if init is None and regular is None:
        return None
    return PodStatus(init_container_statuses=init, container_statuses=regular)


async def _changed(ctx: PodContext, notes_changed: anyio.Event) -> None:
    await first_of(ctx.runtime_changed(timeout=RESYNC_SECONDS), notes_changed.wait())


def plugin(config: NoConfig, handle: AgentHandle) -> StatusStage:
    return StatusStage()


plugin.stage_class = StatusStage  # type: ignore[attr-defined]
plugin.config_model = NoConfig  # type: ignore[attr-defined]
