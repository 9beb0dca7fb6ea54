"""Killing containers, the kubelet's way (kuberuntime_container.go killContainer and
kuberuntime_termination_order.go).

Every container is killed in parallel, each with the same grace period:

1. its preStop hook runs (if it has one and the grace is above 0), cut off when the grace runs
   out; the whole seconds it took are subtracted from the grace;
2. a sidecar then waits, within what is left, until every regular container and every sidecar
   declared after it has stopped: sidecars stop after the regular containers, in reverse order;
3. StopContainer gets what is left of the grace, but never less than 2 s
   (minimumGracePeriodInSeconds): the stop signal, then SIGKILL when the timeout runs out.

Grace periods are real time, not the injectable clock: the runtime's stop timeout is.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass

import anyio
import structlog

from cri import CriError, NotFound
from cri import types as t
from nodeagent import labels as L
from nodeagent.events import ContainerStopped
from nodeagent.kube.restartpolicy import is_sidecar
from nodeagent.model import Container, ContainerPort, LifecycleHandler, Pod
from nodeagent.stages import PodContext
from plugins.runtime.events import ContainerKilled, HookFailed
from plugins.runtime.hooks import HookError, HookTarget, format_pod, run_hook

MINIMUM_GRACE_SECONDS = 2  # minimumGracePeriodInSeconds
OUTCOME_WAIT_SECONDS = 5.0  # how long a stopped container's exit may take to show in its status
OUTCOME_POLL_SECONDS = 0.05

log = structlog.get_logger("plugins.runtime")


@dataclass(frozen=True)
class Victim:
    """A running container to kill."""

    id: str
    name: str
    sidecar: bool = False
    pre_stop: LifecycleHandler | None = None
    ports: tuple[ContainerPort, ...] = ()
    grace: int | None = None
    """Overrides the pod's grace: a container the spec does not know (an orphan) keeps the
    grace recorded in its annotations, as the kubelet restores it from there."""


def pod_grace(pod: Pod) -> int:
    """The grace of a kill the agent decides on its own (the kubelet's setTerminationGracePeriod)."""
    grace = pod.metadata.deletion_grace_period_seconds
    return grace if grace is not None else pod.spec.termination_grace_period_seconds


def victim(pod: Pod, container_id: str, name: str, annotations: dict[str, str] | None = None) -> Victim:
    """What to kill and how, from the spec; from the container's annotations when the spec does
    not know it (restoreSpecsFromContainerLabels)."""
    spec = next((c for c in pod.all_containers() if c.name == name), None)
    if spec is not None:
        return _from_spec(pod, container_id, spec)
    annotations = annotations or {}
    pre_stop = None
    if L.CONTAINER_PRESTOP_HANDLER in annotations:
        try:
            pre_stop = LifecycleHandler.model_validate(json.loads(annotations[L.CONTAINER_PRESTOP_HANDLER]))
        except ValueError:
            pre_stop = None
    ports: tuple[ContainerPort, ...] = ()
    try:
        ports = tuple(ContainerPort.model_validate(p) for p in json.loads(annotations.get(L.CONTAINER_PORTS, "[]")))
    except ValueError:
        pass
    grace = None
    for key in (L.POD_DELETION_GRACE_PERIOD, L.POD_TERMINATION_GRACE_PERIOD):
        if annotations.get(key, "").isdigit():
            grace = int(annotations[key])
            break
    return Victim(container_id, name, pre_stop=pre_stop, ports=ports, grace=grace)


def _from_spec(pod: Pod, container_id: str, spec: Container) -> Victim:
    # A regular container may carry restartPolicy too (ContainerRestartRules): not a sidecar.
    sidecar = is_sidecar(spec) and any(c.name == spec.name for c in pod.spec.init_containers)
    pre_stop = spec.lifecycle.pre_stop if spec.lifecycle else None
    return Victim(container_id, spec.name, sidecar=sidecar, pre_stop=pre_stop, ports=tuple(spec.ports))


def in_spec_order(pod: Pod, victims: Sequence[Victim]) -> list[Victim]:
    order = {c.name: i for i, c in enumerate(pod.all_containers())}
    return sorted(victims, key=lambda v: order.get(v.name, len(order)))


async def kill(ctx: PodContext, victims: Sequence[Victim], grace: int, reason: str, pod_ip: str = "") -> None:
    """Kill ``victims`` (each with ``grace`` seconds unless it carries its own), sidecars last in
    reverse spec order. Returns when every one has stopped."""
    victims = in_spec_order(ctx.pod, victims)
    stopped = {v.id: anyio.Event() for v in victims}
    mains = [v for v in victims if not v.sidecar]
    sidecars = [v for v in victims if v.sidecar]
    waits_for = {
        s.id: [stopped[m.id] for m in mains] + [stopped[later.id] for later in sidecars[i + 1:]]
        for i, s in enumerate(sidecars)
    }
    async with anyio.create_task_group() as tg:
        for v in victims:
            tg.start_soon(_kill_one, ctx, v, v.grace if v.grace is not None else grace,
                          waits_for.get(v.id, []), stopped[v.id], reason, pod_ip)


async def _kill_one(ctx: PodContext, v: Victim, grace: int, prerequisites: list[anyio.Event],
                    stopped: anyio.Event, reason: str, pod_ip: str) -> None:
    remaining = grace
    pre_stop_seconds = 0.0
    try:
        if v.pre_stop is not None and grace > 0:
            begin = time.monotonic()
            with anyio.move_on_after(grace):
                await _pre_stop(ctx, v, pod_ip)
            pre_stop_seconds = time.monotonic() - begin
            remaining -= int(pre_stop_seconds)  # whole seconds, as the kubelet subtracts them
        if prerequisites and remaining > 0:
            begin = time.monotonic()
            with anyio.move_on_after(remaining):
                for event in prerequisites:
                    await event.wait()
            remaining -= int(time.monotonic() - begin)
        timeout = max(remaining, MINIMUM_GRACE_SECONDS)
        try:
            await ctx.runtime.stop_container(v.id, timeout)
        except NotFound:
            return
        except CriError as exc:
            ctx.log.warning("stopping a container failed", container=v.name, container_id=v.id, error=str(exc))
            return
    finally:
        stopped.set()
    exit_code, finished_at = await _outcome(ctx, v.id)
    await ctx.publish(ContainerStopped(container=v.name, container_id=v.id))
    await ctx.publish(ContainerKilled(container=v.name, container_id=v.id, reason=reason,
                                      pre_stop_seconds=round(pre_stop_seconds, 3), stop_timeout_seconds=timeout,
                                      exit_code=exit_code, finished_at=finished_at))


async def _pre_stop(ctx: PodContext, v: Victim, pod_ip: str) -> None:
    assert v.pre_stop is not None
    target = HookTarget(pod=format_pod(ctx.pod), container=v.name, container_id=v.id, pod_ip=pod_ip, ports=v.ports)
    try:
        await run_hook(ctx.runtime, v.pre_stop, target)
    except HookError as exc:
        ctx.log.warning("preStop hook failed", container=v.name, error=str(exc))
        await ctx.publish(HookFailed(container=v.name, container_id=v.id, hook="PreStop",
                                     reason="FailedPreStopHook", message=str(exc)))


async def _outcome(ctx: PodContext, container_id: str) -> tuple[int | None, float | None]:
    """The stopped container's exit code and finish time, once the runtime reports it exited.

    StopContainer can return before the status says so: containerd 1.6 answers at once when
    the task is already gone (a process that exited on its own, e.g. from its preStop hook),
    while its exit handler, which deletes the task before it records the exit, has not yet
    recorded it. So a status still saying running is read again, briefly, until it shows the
    exit; any other state (a container created and never started) has no exit to wait for."""
    with anyio.move_on_after(OUTCOME_WAIT_SECONDS):
        while True:
            try:
                status: t.ContainerStatus = await ctx.runtime.container_status(container_id)
            except CriError:
                return None, None
            if status.state == t.ContainerState.CONTAINER_EXITED:
                return status.exit_code, status.finished_at / 1e9 if status.finished_at else None
            if status.state != t.ContainerState.CONTAINER_RUNNING:
                return None, None
            await anyio.sleep(OUTCOME_POLL_SECONDS)
    return None, None
