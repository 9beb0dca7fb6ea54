"""What to do next for a pod, from its spec and what the runtime shows (the kubelet's
computePodActions and computeInitContainerActions, kuberuntime_manager.go / _container.go).

Pure: no I/O, so every rule can be read and tested on its own. The runtime stage runs the plan
and plans again once the relister has seen the result, exactly as the kubelet's sync loop does;
one plan therefore starts at most one new init container, and a sidecar counts as started once
the runtime shows it running.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from nodeagent.kube.restartpolicy import (
    container_should_restart,
    init_failed,
    is_sidecar,
    should_restart,
)
from nodeagent.model import Container, Pod
from nodeagent.runtimeview import ContainerRecord, PodRuntime

Kind = Literal["init", "sidecar", "container", "ephemeral"]


@dataclass(frozen=True)
class Step:
    """Start one container: create a new instance, or start the one the runtime holds in state
    CREATED (``resume``, left by an interrupted start)."""

    container: Container
    kind: Kind
    latest: ContainerRecord | None
    """The newest instance of this container in any sandbox: the restart count and the
    back-off follow it."""
    resume: ContainerRecord | None = None
    """An instance in state CREATED to start instead of creating one."""

    @property
    def blocking(self) -> bool:
        """A regular init container must succeed before anything after it may start."""
        return self.kind == "init"


@dataclass(frozen=True)
class Plan:
    new_sandbox: bool = False
    """The sandbox is gone or dead: kill what runs, make a new one (init containers run again)."""
    kill_pod: bool = False
    """Nothing will run again (all regular containers are done under the restart policy, or an
    init container failed under Never): stop what still runs, sidecars included, and restart
    nothing."""
    starts: tuple[Step, ...] = ()
    initialized: bool = False


def plan(pod: Pod, runtime: PodRuntime, restart: frozenset[str] = frozenset(), since: int = 0,
         unstarted: frozenset[str] = frozenset()) -> Plan:
    """``restart``: ids of exited instances to restart whatever the restart policy (killed by the
    agent for an in-place resize whose resizePolicy is RestartContainer). ``since``: when the pod
    was last restarted as a whole (RestartAllContainers): older instances are history only.
    ``unstarted``: ids of running sidecars whose startup probe has not passed yet."""
    spec = pod.spec
    sandbox = runtime.newest_sandbox()
    if sandbox is None or not sandbox.ready:
        # PodSandboxChanged. Under Never a pod whose sandbox died after containers ran is not
        # started again: it just ends (the kubelet's "do not recreate" rule).
        if spec.restart_policy == "Never" and sandbox is not None and runtime.containers:
            return Plan(kill_pod=True)
        return Plan(new_sandbox=True)

    here = runtime.latest_in(sandbox.id, since)
    # Any regular container in this sandbox means initialization finished once: init
    # containers never run again in it (they may have been removed since).
    previously_initialized = any(c.name in here for c in spec.containers)
    init_starts, initialized, failed = _init_actions(pod, here, previously_initialized, unstarted)
    if failed:
        return Plan(kill_pod=True)

    def step(c: Container, kind: Kind) -> Step:
        rec = here.get(c.name)
        return Step(c, kind, runtime.latest(c.name), resume=rec if rec is not None and rec.state == "created" else None)

    # Ephemeral containers run once, initialized or not, and are never restarted (they have
    # no instance yet: started; an instance of any state: done).
    starts = [step(c, "ephemeral") for c in spec.ephemeral_containers if runtime.latest(c.name) is None]
    starts += [step(spec.init_containers[i], "sidecar" if is_sidecar(spec.init_containers[i]) else "init")
               for i in init_starts]
    if not initialized:
        return Plan(starts=tuple(starts))

    keep = 0
    regular: list[Step] = []
    for c in spec.containers:
        rec = here.get(c.name)
        if rec is None:
            # First start, the sandbox was replaced, or the pod was restarted as a whole: start
            # it unless its last instance (before) is done for good under the policy.
            latest = runtime.latest(c.name)
            if (since and latest is not None and latest.created_at <= since) or should_restart(spec, c, latest):
                regular.append(step(c, "container"))
        elif rec.running:
            keep += 1
        elif rec.state == "created" or (rec.exited and (rec.id in restart or should_restart(spec, c, rec))):
            regular.append(step(c, "container"))
    if keep == 0 and not regular:
        # Sidecars must not keep a finished pod alive: stop them, restart none.
        return Plan(kill_pod=True, initialized=True)
    return Plan(starts=(*starts, *regular), initialized=True)


def _init_actions(pod: Pod, here: dict[str, ContainerRecord], previously_initialized: bool,
                  unstarted: frozenset[str] = frozenset()) -> tuple[list[int], bool, bool]:
    """computeInitContainerActions: (indexes of init containers to start, initialized, failed
    for good). Scans from the last init container that has an instance, as the kubelet does,
    so that before initialization only the frontier moves."""
    inits = pod.spec.init_containers
    if not inits:
        return [], True, False
    restart_on_failure = pod.spec.restart_policy != "Never"
    to_start: list[int] = []
    initialized = previously_initialized
    for i in reversed(range(len(inits))):
        c = inits[i]
        rec = here.get(c.name)
        sidecar = is_sidecar(c)
        if rec is None:
            if previously_initialized and sidecar:
                to_start.append(i)  # its instance vanished: a sidecar is kept running
            continue
        if previously_initialized and not sidecar:
            continue  # after initialization only sidecars matter
        if rec.state == "created":
            to_start.append(i)
        elif rec.running:
            if sidecar:
                if rec.id in unstarted:
                    pass  # started only once its startup probe passed: the next ones wait
                elif i == len(inits) - 1:
                    initialized = True
                elif not previously_initialized:
                    to_start.append(i + 1)  # started: the next one may go
            # a regular init container: wait for it to exit
        elif sidecar:
            to_start.append(i)  # exited (or lost): sidecars restart whatever the policy
        elif init_failed(rec):
            # Per container (ContainerRestartRules); a lost instance has no exit code to judge.
            if rec.state == "unknown":
                restartable = restart_on_failure
            else:
                restartable = container_should_restart(pod.spec, c, rec.exit_code)
            if not restartable:
                return [], False, True
            to_start.append(i)
        elif rec.exited:
            if i == len(inits) - 1:
                initialized = True
            else:
                to_start.append(i + 1)
        if not previously_initialized:
            break
    if not initialized and not to_start and not any(c.name in here for c in inits):
        to_start.append(0)
    return sorted(set(to_start)), initialized, False
