"""The runtime stage: images and the sandbox (prepare), containers (start), restarts with
CrashLoopBackOff (observe), and the reverse (stop, unprepare, cleanup) — all through CRI.

Every step first looks at what the runtime already has for the pod (found by the kubelet's
labels), so that a restarted agent adopts its sandbox and containers instead of duplicating
them, and so that every undo is idempotent.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import anyio

from cri import AlreadyExists, CriError, NotFound
from cri import types as t
from nodeagent import labels as L
from nodeagent.additions import additions_for
from nodeagent.events import ContainerCreated, ContainerStopped, SandboxRemoved, SandboxStarted
from nodeagent.model import Container
from nodeagent.stages import AgentHandle, Cleanup, Observe, PodContext, Prepare, Result, Start
from nodeagent.stash import StashKey
from plugins.restartpolicy import should_restart
from plugins.runtime.backoff import Backoff
from plugins.runtime.container import container_config
from plugins.runtime.images import ImagePuller
from plugins.runtime.sandbox import log_directory, sandbox_config

SANDBOX = StashKey[tuple[str, t.PodSandboxConfig]]("runtime.sandbox")
IMAGE_REFS = StashKey[dict[str, str]]("runtime.image_refs")

CRASHLOOP_INITIAL = 10.0  # the kubelet's initial CrashLoopBackOff
CRASHLOOP_MAX = 300.0  # MaxContainerBackOff
MINIMUM_GRACE_SECONDS = 2  # minimumGracePeriodInSeconds
RESYNC_SECONDS = 10.0
# How containerd words a StartContainer whose caller went away: the gRPC context was cancelled,
# or the shim being started was killed with it. A real start failure (a missing executable, a
# permission) says something else and counts as a restart.
INTERRUPTED_START_MARKS = ("context canceled", "signal: killed")


class RuntimeStage(Prepare, Start, Observe, Cleanup):
    name: ClassVar[str] = "runtime"

    def __init__(self, node_name: str, pod_logs_dir: Path) -> None:
        self._node = node_name
        self._logs = pod_logs_dir
        self._images = ImagePuller.new()
        self._crashloop = Backoff(CRASHLOOP_INITIAL, CRASHLOOP_MAX)

    # --- prepare: images, then the sandbox ------------------------------------------------

    async def prepare(self, ctx: PodContext) -> Result:
        refs: dict[str, str] = {}
        for container in ctx.pod.all_containers():
            ref, problem = await self._images.ensure(ctx, container)
            if problem is not None:
                return problem
            ctx.status.clear_container_waiting(container.name)
            refs[container.name] = ref
        ctx.stash[IMAGE_REFS] = refs
        await self._ensure_sandbox(ctx)
        return Result.ok()

    async def _ensure_sandbox(self, ctx: PodContext) -> None:
        pod = ctx.pod
        sandboxes = await ctx.runtime.list_pod_sandbox(t.PodSandboxFilter(label_selector={L.POD_UID: pod.uid}))
        sandboxes = [s for s in sandboxes if s.labels.get(L.MANAGED_BY) == self._node]
        ready = sorted((s for s in sandboxes if s.state == t.PodSandboxState.SANDBOX_READY),
                       key=lambda s: s.created_at, reverse=True)
        if ready:
            sandbox = ready[0]
            attempt = sandbox.metadata.attempt if sandbox.metadata else 0
            config = sandbox_config(pod, attempt, self._logs, self._node)
            ctx.stash[SANDBOX] = (sandbox.id, config)
            await ctx.publish(SandboxStarted(sandbox_id=sandbox.id, attempt=attempt, adopted=True,
                                             pod_ip=await self._pod_ip(ctx, sandbox.id)))
            return
        attempt = max((s.metadata.attempt + 1 for s in sandboxes if s.metadata), default=0)
        config = sandbox_config(pod, attempt, self._logs, self._node)
        log_directory(self._logs, pod).mkdir(parents=True, exist_ok=True, mode=0o755)
        sandbox_id = await ctx.runtime.run_pod_sandbox(config)
        ctx.stash[SANDBOX] = (sandbox_id, config)
        ctx.request_relist()
        await ctx.publish(SandboxStarted(sandbox_id=sandbox_id, attempt=attempt,
                                         pod_ip=await self._pod_ip(ctx, sandbox_id)))

    @staticmethod
    async def _pod_ip(ctx: PodContext, sandbox_id: str) -> str:
        status = await ctx.runtime.pod_sandbox_status(sandbox_id)
        return status.network.ip if status.network else ""

    async def unprepare(self, ctx: PodContext) -> None:
        for sandbox in await self._sandboxes(ctx):
            if sandbox.state == t.PodSandboxState.SANDBOX_READY:
                try:
                    await ctx.runtime.stop_pod_sandbox(sandbox.id)
                except NotFound:
                    pass

    # --- start: the containers -------------------------------------------------------------

    async def start(self, ctx: PodContext) -> Result:
        if SANDBOX not in ctx.stash:
            return Result.retry("SandboxMissing", "no sandbox was prepared for the pod")
        existing = await self._containers(ctx)
        for container in ctx.pod.spec.containers:
            mine = sorted((c for c in existing if c.labels.get(L.CONTAINER_NAME) == container.name),
                          key=lambda c: (c.metadata.attempt if c.metadata else 0, c.created_at))
            latest = mine[-1] if mine else None
            if latest is not None and latest.state == t.ContainerState.CONTAINER_RUNNING:
                continue  # adopted after a restart
            if latest is not None and latest.state == t.ContainerState.CONTAINER_CREATED:
                await ctx.runtime.start_container(latest.id)
                continue
            attempt = 0
            if latest is not None and latest.state == t.ContainerState.CONTAINER_EXITED:
                if not await self._start_was_interrupted(ctx, latest):
                    continue  # restarting exited containers is the observe loop's job (back-off)
                # Our own StartContainer was cut off (the agent died mid-call): that is not the
                # container failing, so it does not count as a restart. Replace the instance.
                await ctx.runtime.remove_container(latest.id)
                attempt = latest.metadata.attempt if latest.metadata else 0
            await self._run_container(ctx, container, attempt=attempt)
        ctx.request_relist()
        return Result.ok()

    @staticmethod
    async def _start_was_interrupted(ctx: PodContext, c: t.Container) -> bool:
        status = await ctx.runtime.container_status(c.id)
        return (status.started_at == 0 and status.reason == "StartError"
                and any(mark in status.message for mark in INTERRUPTED_START_MARKS))

    async def _run_container(self, ctx: PodContext, container: Container, attempt: int) -> None:
        sandbox_id, sandbox = ctx.stash[SANDBOX]
        ref = ctx.stash.get(IMAGE_REFS, {}).get(container.name, "")
        config = container_config(ctx.pod, container, attempt, ref, self._node,
                                  additions=additions_for(ctx.stash, container.name))
        try:
            container_id = await ctx.runtime.create_container(sandbox_id, config, sandbox)
        except CriError as exc:
            ctx.status.container_waiting(container.name, "CreateContainerError", str(exc.details or exc))
            raise
        await ctx.publish(ContainerCreated(container=container.name, container_id=container_id, attempt=attempt))
        try:
            await ctx.runtime.start_container(container_id)
        except CriError as exc:
            ctx.status.container_waiting(container.name, "RunContainerError", str(exc.details or exc))
            raise
        ctx.status.clear_container_waiting(container.name)

    async def stop(self, ctx: PodContext, grace_period: float) -> None:
        # The kubelet never gives less than 2 s between the stop signal and SIGKILL.
        timeout = max(int(grace_period), MINIMUM_GRACE_SECONDS)
        running = [c for c in await self._containers(ctx) if c.state == t.ContainerState.CONTAINER_RUNNING]

        async def stop_one(c: t.Container) -> None:
            try:
                await ctx.runtime.stop_container(c.id, timeout)
            except NotFound:
                return
            await ctx.publish(ContainerStopped(container=c.labels.get(L.CONTAINER_NAME, ""), container_id=c.id))

        async with anyio.create_task_group() as tg:
            for c in running:
                tg.start_soon(stop_one, c)

    # --- observe: restart exited containers per restartPolicy, with CrashLoopBackOff ------

    async def observe(self, ctx: PodContext) -> None:
        while True:
            delay = await self._reconcile(ctx)
            await ctx.runtime_changed(timeout=min(delay, RESYNC_SECONDS))

    async def _reconcile(self, ctx: PodContext) -> float:
        """Restart what the policy says; returns how soon to look again."""
        pod = ctx.pod
        observed = ctx.observed
        soonest = RESYNC_SECONDS
        for container in pod.spec.containers:
            latest = observed.latest(container.name)
            if latest is None or not latest.exited:
                continue
            if not should_restart(pod.spec.restart_policy, latest):
                continue
            key = f"{pod.metadata.name}_{pod.metadata.namespace}_{pod.uid}_{container.name}"
            now = ctx.clock.now()
            finished = latest.finished_at / 1e9 if latest.finished_at else now
            wait = self._crashloop.remaining(key, finished, now)
            if wait > 0:
                delay = self._crashloop.current(key)
                ctx.status.container_waiting(
                    container.name, "CrashLoopBackOff",
                    f"back-off {int(delay)}s restarting failed container={container.name} "
                    f"pod={pod.metadata.name}_{pod.metadata.namespace}({pod.uid})",
                )
                soonest = min(soonest, wait)
                continue
            self._crashloop.next(key, finished)
            await self._remove_old_instances(ctx, container.name, keep=latest.id)
            await self._run_container(ctx, container, attempt=latest.attempt + 1)
            ctx.request_relist()
        return soonest

    async def _remove_old_instances(self, ctx: PodContext, name: str, keep: str) -> None:
        # The kubelet keeps one dead instance per container (lastState); older ones go.
        for c in ctx.observed.containers:
            if c.name == name and c.id != keep and c.exited:
                try:
                    await ctx.runtime.remove_container(c.id)
                except NotFound:
                    pass

    # --- cleanup ---------------------------------------------------------------------------

    async def cleanup(self, ctx: PodContext) -> None:
        for c in await self._containers(ctx):
            try:
                await ctx.runtime.remove_container(c.id)
            except NotFound:
                pass
        for sandbox in await self._sandboxes(ctx):
            try:
                await ctx.runtime.stop_pod_sandbox(sandbox.id)
                await ctx.runtime.remove_pod_sandbox(sandbox.id)
            except NotFound:
                continue
            await ctx.publish(SandboxRemoved(sandbox_id=sandbox.id))
        ctx.stash.pop(SANDBOX)
        logs = self._logs / f"{ctx.ref.namespace}_{ctx.ref.name}_{ctx.ref.uid}"
        await anyio.to_thread.run_sync(lambda: shutil.rmtree(logs, ignore_errors=True))
        await anyio.to_thread.run_sync(lambda: shutil.rmtree(ctx.pod_dir, ignore_errors=True))

    # --- what the runtime has for this pod -------------------------------------------------

    async def _sandboxes(self, ctx: PodContext) -> list[t.PodSandbox]:
        found = await ctx.runtime.list_pod_sandbox(t.PodSandboxFilter(label_selector={L.POD_UID: ctx.ref.uid}))
        return [s for s in found if s.labels.get(L.MANAGED_BY) == self._node]

    async def _containers(self, ctx: PodContext) -> list[t.Container]:
        found = await ctx.runtime.list_containers(t.ContainerFilter(label_selector={L.POD_UID: ctx.ref.uid}))
        return [c for c in found if c.labels.get(L.MANAGED_BY) == self._node]


def plugin(config: Mapping[str, Any], handle: AgentHandle) -> RuntimeStage:
    if config:
        raise TypeError(f"runtime takes no configuration, got {sorted(config)}")
    return RuntimeStage(handle.node.name, Path(handle.settings.pod_logs_dir))


plugin.stage_class = RuntimeStage  # type: ignore[attr-defined]
__all__ = ["RuntimeStage", "plugin", "AlreadyExists"]
