"""In-place pod resize, the kubelet's way (allocation/allocation_manager.go handlePodResourcesResize,
kuberuntime_manager.go computePodResizeAction / doPodResizeAction, status/status_manager.go for
the PodResizePending and PodResizeInProgress conditions).

The API server's ``resize`` subresource changes the pod's spec; the worker hands the new spec to
the stages as ``ctx.pod``. Every pass of the runtime stage's sync loop (sync.py) first calls
:meth:`Resizer.reconcile`, which

1. *allocates*: when the desired resources (the spec) differ from the allocated ones, checks that
   the pod still fits: Infeasible when it could not fit even an empty node, Deferred while the
   other pods' allocations leave no room (asked again every pass); otherwise the desired
   resources become the allocation (PodResizeInProgress until actuated);
2. *actuates*: every running container whose applied resources differ from its allocation is
   updated in place (CRI UpdateContainerResources) or, when its resizePolicy says
   RestartContainer for a changed resource, killed so that the sync loop restarts it with the new
   resources (without CrashLoopBackOff: nothing crashed). A memory limit below the container's
   current usage is refused (PodResizeInProgress, reason Error, retried every pass);
3. sets the pod cgroup (podcgroup.py) before containers grow and after they shrink.

Containers are always created with their *allocated* resources (:func:`allocated_pod`), never the
desired ones, so a deferred resize does not sneak in through a restart. The status stage reports
allocation, actuation and conditions from the :class:`ResizeState` this stage provides as the
fact nodeagent.podfacts.RESIZE.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from cri import CriError, NotFound, Unimplemented
from nodeagent.kube.resize import DEFERRED, ERROR, INFEASIBLE, ResizeState, same, with_resources
from nodeagent.kube.resources import (
    FIT_RESOURCES,
    Values,
    linux_resources,
    pod_requests,
    qos_class,
    values,
)
from nodeagent.model import Container, Pod
from nodeagent.podfacts import RESIZE, notes_of
from nodeagent.runtimeview import PodRuntime
from nodeagent.stages import PodContext
from plugins.runtime import podcgroup
from plugins.runtime.termination import kill, pod_grace, victim


def state_of(ctx: PodContext) -> ResizeState | None:
    return ctx.facts.get(RESIZE)


def ensure_state(ctx: PodContext) -> ResizeState:
    """The allocation starts as the spec the pod was admitted with."""
    state = ctx.facts.get(RESIZE)
    if state is None:
        pod = ctx.pod
        state = ResizeState(generation=pod.metadata.generation,
                            containers={c.name: c.resources for c in pod.all_containers()},
                            pod=pod.spec.resources, observed_generation=pod.metadata.generation)
        ctx.facts.set(RESIZE, state)
    return state


def allocated_pod(ctx: PodContext) -> Pod:
    """``ctx.pod`` with the allocated resources in place of the desired ones."""
    state = state_of(ctx)
    if state is None:
        return ctx.pod
    return with_resources(ctx.pod, state.containers, state.pod)


def record_created(ctx: PodContext, container_id: str, container: Container) -> None:
    """A new instance runs with ``container``'s resources (the allocated ones)."""
    state = state_of(ctx)
    pod_level = state.pod if state is not None else ctx.pod.spec.resources
    if state is not None:
        state.applied[container_id] = (container.resources, values(container.resources, pod_level))


def skip_backoff(ctx: PodContext, container_id: str) -> bool:
    """The exited instance was killed for a resize: restart it at once."""
    state = state_of(ctx)
    return state is not None and container_id in state.restarting


def resize_restarts(ctx: PodContext) -> frozenset[str]:
    """Ids of instances killed for a resize: restarted whatever the pod's restartPolicy (the
    kubelet puts them in ContainersToStart)."""
    state = state_of(ctx)
    return frozenset(state.restarting) if state is not None else frozenset()


# --- node fit --------------------------------------------------------------------------


class Ledger:
    """The node's allocations (requests of every pod the runtime stage runs), for the fit check
    of a resize; node-wide, owned by the runtime stage."""

    def __init__(self) -> None:
        self._pods: dict[str, dict[str, int]] = {}
        self._burstable: set[str] = set()

    def set(self, uid: str, pod: Pod) -> None:
        self._pods[uid] = pod_requests(pod)
        if qos_class(pod) == "Burstable":
            self._burstable.add(uid)
        else:
            self._burstable.discard(uid)

    def release(self, uid: str) -> None:
        self._pods.pop(uid, None)
        self._burstable.discard(uid)

    def burstable_cpu_milli(self) -> int:
        """The Burstable pods' CPU requests summed: what the Burstable QoS tier is sized by."""
        return sum(self._pods[uid].get("cpu", 0) for uid in self._burstable)

    def uids(self) -> set[str]:
        """The pods the runtime stage runs (from their sandbox's making to their cleanup)."""
        return set(self._pods)

    def fit(self, uid: str, pod: Pod, allocatable: Mapping[str, int]) -> tuple[str, str] | None:
        """None when ``pod`` fits beside the others; else (Infeasible | Deferred, message)."""
        wanted = pod_requests(pod)
        for res in FIT_RESOURCES:
            if res not in wanted or res not in allocatable:
                continue
            if wanted[res] > allocatable[res]:
                return INFEASIBLE, (f"Node didn't have enough capacity: {res}, requested: {wanted[res]}, "
                                    f"capacity: {allocatable[res]}")
        for res in FIT_RESOURCES:
            if res not in wanted or res not in allocatable:
                continue
            used = sum(p.get(res, 0) for u, p in self._pods.items() if u != uid)
            if used + wanted[res] > allocatable[res]:
                return DEFERRED, (f"Node didn't have enough resource: {res}, requested: {wanted[res]}, "
                                  f"used: {used}, capacity: {allocatable[res]}")
        return None


# --- the resizer ----------------------------------------------------------------------


@dataclass
class Resizer:
    ledger: Ledger

    async def reconcile(self, ctx: PodContext, runtime: PodRuntime) -> bool:
        """Allocate a changed spec if it fits, then actuate the allocation. Never raises for a
        runtime failure: it shows as PodResizeInProgress (Error) and is retried next pass.
        True when a container was killed to be restarted with new resources."""
        state = ensure_state(ctx)
        before = (state.pending, state.in_progress, state.observed_generation, len(state.applied))
        self._allocate(ctx, state)
        killed = await self._actuate(ctx, state, runtime)
        if (state.pending, state.in_progress, state.observed_generation, len(state.applied)) != before:
            notes_of(ctx.facts).touch()  # the status stage reports the new state
        return killed

    def _allocate(self, ctx: PodContext, state: ResizeState) -> None:
        pod = ctx.pod
        desired = {c.name: c.resources for c in pod.all_containers()}
        changed = (pod.spec.resources is not None or state.pod is not None) and not same(pod.spec.resources, state.pod)
        changed = changed or any(not same(r, state.containers.get(n)) for n, r in desired.items())
        if not changed:
            # Desired == allocated (a resize reverted before it was accepted): nothing pending.
            state.pending = None
            state.observed_generation = max(state.observed_generation, pod.metadata.generation)
            self.ledger.set(ctx.ref.uid, allocated_pod(ctx))
            return
        verdict = self.ledger.fit(ctx.ref.uid, pod, ctx.node.allocatable)
        state.observed_generation = max(state.observed_generation, pod.metadata.generation)
        if verdict is not None:
            if state.pending != verdict:
                ctx.log.info("resize pending", reason=verdict[0], message=verdict[1])
            state.pending = verdict
            return
        ctx.log.info("resize accepted", generation=pod.metadata.generation)
        state.containers = desired
        state.pod = pod.spec.resources
        state.generation = pod.metadata.generation
        state.pending = None
        state.in_progress = ("", "")
        self.ledger.set(ctx.ref.uid, pod)

    async def _actuate(self, ctx: PodContext, state: ResizeState, runtime: PodRuntime) -> bool:
        sandbox = runtime.newest_sandbox()
        if sandbox is None or not sandbox.ready:
            state.in_progress = None  # the new sandbox's containers start with the allocation
            return False
        pod = allocated_pod(ctx)
        here = runtime.latest_in(sandbox.id)
        updates: list[tuple[Container, str, Values, Values]] = []
        restarts: list[tuple[Container, str]] = []
        busy = False
        for c in pod.all_containers():
            rec = here.get(c.name)
            if rec is None:
                continue
            if rec.id in state.restarting:
                busy = True  # killed for a resize; its successor is not created yet
                continue
            if not rec.running:
                continue
            want = values(c.resources, state.pod)
            applied = state.applied.get(rec.id)
            adopted = applied is None
            if applied is None:
                # An instance this agent did not create (adopted after a restart): it runs with
                # the allocation unless the runtime reports other values, which an update (or a
                # restart, per the policy) then corrects.
                applied = (c.resources, await _adopted_values(ctx, rec.id, c, pod, want))
                state.applied[rec.id] = applied
            have = applied[1]
            if have == want:
                if not same(applied[0], c.resources):
                    state.applied[rec.id] = (c.resources, want)  # e.g. ephemeral-storage only
                continue
            # An adopted instance is only updated in place: what it ran with before the agent
            # restarted is read back imprecisely, never a reason to kill it.
            if not adopted and _needs_restart(c, have, want):
                restarts.append((c, rec.id))
            else:
                updates.append((c, rec.id, have, want))
        error = await _pod_memory_check(ctx, pod, state)
        if error is None:
            error = await self._pod_cgroup(ctx, sandbox.id, pod, state, grow=True)
        if error is None and updates:
            error = await self._update(ctx, pod, state, updates)
        if error is None:
            error = await self._pod_cgroup(ctx, sandbox.id, pod, state, grow=False)
        for c, container_id in restarts:
            state.restarting.add(container_id)
            ctx.log.info("restarting container for a resize", container=c.name)
            try:
                await kill(ctx, [victim(ctx.pod, container_id, c.name)], pod_grace(ctx.pod), "Killing")
            except CriError as exc:
                error = error or f"failed to restart container {c.name!r}: {exc}"
            busy = True
        if error is not None:
            state.in_progress = (ERROR, error)
        elif busy or restarts:
            state.in_progress = state.in_progress or ("", "")
        else:
            state.in_progress = None
        # Instances gone from the runtime need no record.
        present = {c.id for c in runtime.containers}
        state.restarting &= present
        for gone in set(state.applied) - present:
            if gone not in {cid for _, cid in restarts}:
                state.applied.pop(gone, None)
        return bool(restarts)

    async def _update(self, ctx: PodContext, pod: Pod, state: ResizeState,
                      updates: list[tuple[Container, str, Values, Values]]) -> str | None:
        """UpdateContainerResources for each container, decreases first; memory limits are not
        set below what the container uses now (validateMemoryResizeAction)."""
        problems = []
        for c, container_id, have, want in updates:
            if want.memory_limit and (not have.memory_limit or want.memory_limit < have.memory_limit):
                usage = await _memory_usage(ctx, container_id)
                if usage is not None and usage >= want.memory_limit:
                    problems.append(f'attempting to set container "{c.name}" memory limit ({want.memory_limit}) '
                                    f"below current usage ({usage})")
        if problems:
            joined = problems[0] if len(problems) == 1 else "[" + ", ".join(problems) + "]"
            return f"cannot decrease memory limits: {joined}"
        ordered = sorted(updates, key=lambda u: (u[3].memory_limit - u[2].memory_limit)
                         + (u[3].cpu_limit - u[2].cpu_limit))
        for c, container_id, _have, want in ordered:
            try:
                await ctx.runtime.update_container_resources(container_id, linux_resources(c, pod))
            except NotFound:
                continue  # gone meanwhile; its successor is created with the allocation
            except CriError as exc:
                return f"failed to update container {c.name!r} resources: {exc.details or exc}"
            state.applied[container_id] = (c.resources, want)
            ctx.log.info("container resized", container=c.name, cpu_request=want.cpu_request,
                         cpu_limit=want.cpu_limit, memory_limit=want.memory_limit)
        return None

    @staticmethod
    async def _pod_cgroup(ctx: PodContext, sandbox_id: str, pod: Pod, state: ResizeState, *,
                          grow: bool) -> str | None:
        """The pod cgroup's limits widen before its containers change and narrow after
        (doPodResizeAction's order): first the loosest of old and new, then the new values.
        The runtime is told first (UpdatePodSandboxResources): its refusal rejects the resize,
        and a cgroup that cannot be set is told back."""
        want = podcgroup.pod_values(pod)
        have = state.pod_cgroup
        if have == want:
            return None
        target = podcgroup.widest(have, want) if grow and have is not None else want
        if target == have:
            return None
        # Only a change of values the pod cgroup had is a resize the runtime hears of: the first
        # setting (have None: the start's could not be made) is not, nor is anything without
        # pod cgroups (cgroupsPerQOS false).
        tell = have is not None and podcgroup.enabled(ctx.settings)
        try:
            if tell:
                await _tell_runtime(ctx, sandbox_id, pod, target)
        except CriError as exc:
            return f"failed to notify runtime for UpdatePodSandboxResources; resize rejected: {exc.details or exc}"
        try:
            await podcgroup.apply(ctx, pod, target)
        except OSError as exc:
            if tell and have is not None:
                try:
                    await _tell_runtime(ctx, sandbox_id, pod, have)
                except CriError as rollback:
                    ctx.log.warning("failed to notify runtime to roll back UpdatePodSandboxResources",
                                    error=str(rollback))
            return f"failed to set the pod cgroup: {exc}"
        state.pod_cgroup = target
        if target == want:
            state.pod_applied = pod.spec.resources
        return None


async def _tell_runtime(ctx: PodContext, sandbox_id: str, pod: Pod, target: Values) -> None:
    """updatePodSandboxResources: best effort where the runtime lacks it (containerd 1.6:
    Unimplemented; 2.2 said Unknown "not implemented yet"); any other error is the runtime's
    refusal."""
    try:
        await ctx.runtime.update_pod_sandbox_resources(sandbox_id, podcgroup.sandbox_resources(pod, target))
    except Unimplemented:
        return
    except CriError as exc:
        if exc.code is not None and exc.code.name == "UNKNOWN" and "not implemented" in (exc.details or ""):
            return
        raise


async def _pod_memory_check(ctx: PodContext, pod: Pod, state: ResizeState) -> str | None:
    """validateMemoryResizeAction for the pod: its cgroup's memory limit is not set below what
    the pod uses now. (Containers are checked one by one in Resizer._update.)"""
    want = podcgroup.pod_values(pod).memory_limit
    have = state.pod_cgroup.memory_limit if state.pod_cgroup is not None else 0
    if not want or (have and want >= have):
        return None
    usage = await podcgroup.memory_usage(pod, ctx.settings)
    if usage is None or usage < want:
        return None
    return f"cannot decrease memory limits: attempting to set pod memory limit ({want}) below current usage ({usage})"


def _needs_restart(c: Container, have: Values, want: Values) -> bool:
    policy = {p.resource_name: p.restart_policy for p in c.resize_policy}
    cpu = have.cpu_request != want.cpu_request or have.cpu_limit != want.cpu_limit
    memory = have.memory_request != want.memory_request or have.memory_limit != want.memory_limit
    return ((cpu and policy.get("cpu") == "RestartContainer")
            or (memory and policy.get("memory") == "RestartContainer"))


async def _adopted_values(ctx: PodContext, container_id: str, c: Container, pod: Pod, want: Values) -> Values:
    """``want`` if the runtime's view of the container's cgroup agrees with what the allocation
    asks for, else values that differ from it (so that the allocation is applied again)."""
    try:
        status = await ctx.runtime.container_status(container_id)
    except CriError:
        return want
    linux = status.resources.linux if status.resources is not None else None
    if linux is None:
        return want
    expected = linux_resources(c, pod)
    same_cpu = (linux.cpu_shares, linux.cpu_quota) == (expected.cpu_shares, expected.cpu_quota)
    same_memory = linux.memory_limit_in_bytes == expected.memory_limit_in_bytes
    if same_cpu and same_memory:
        return want
    return Values(cpu_request=want.cpu_request if same_cpu else -1, cpu_limit=want.cpu_limit if same_cpu else -1,
                  memory_request=want.memory_request,
                  memory_limit=want.memory_limit if same_memory else -1)


async def _memory_usage(ctx: PodContext, container_id: str) -> int | None:
    try:
        stats = await ctx.runtime.container_stats(container_id)
    except CriError:
        return None
    memory = stats.memory
    return memory.usage_bytes if memory is not None else None


__all__ = ["Ledger", "Resizer", "allocated_pod", "ensure_state", "pod_requests", "record_created", "resize_restarts",
           "skip_backoff", "state_of", "values"]
