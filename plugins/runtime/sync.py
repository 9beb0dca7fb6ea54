"""One pass of the pod's sync loop: plan from what the runtime shows (plan.py), then act —
start containers with their postStart hooks and CrashLoopBackOff, stop what the plan says, or
replace a dead sandbox. The runtime stage runs a pass in ``start`` and then again from
``observe`` every time the runtime changes or a back-off ends.

Before planning, a pass waits until the relister has listed the runtime since this stage last
changed it (the kubelet's ``GetNewerThan``): a plan made from an older listing would start a
container twice.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import anyio

from cri import CriError, NotFound
from cri import types as t
from nodeagent import labels as L
from nodeagent.additions import ContainerAdditions
from nodeagent.events import ContainerCreated
from nodeagent.kube.restartpolicy import unstarted_sidecars
from nodeagent.model import Container
from nodeagent.mounttable import make_rshared
from nodeagent.podfacts import STARTUP_PASSED, notes_of
from nodeagent.runtimeview import ContainerRecord, Expectation, PodRuntime
from nodeagent.stages import PodContext, Result
from nodeagent.stash import StashKey
from nodeagent.terminationmessage import create_message_file, message_mount
from nodeagent.volumebind import VolumeBindError, bind_volume_mounts
from nodeagent.volumeutil.mounts import wants_recursive_read_only, with_recursive_read_only
from plugins.runtime import imagevolumes, restartall
from plugins.runtime.backoff import Backoff
from plugins.runtime.container import container_config, container_hash, runtime_inputs
from plugins.runtime.events import ContainerBackedOff, ContainerFailed, HookFailed
from plugins.runtime.hooks import HookError, HookTarget, format_pod, run_hook
from plugins.runtime.plan import Plan, Step, plan
from plugins.runtime.resize import (
    Resizer,
    allocated_pod,
    record_created,
    resize_restarts,
    skip_backoff,
)
from plugins.runtime.runtimeclass import handler_of
from plugins.runtime.sandbox import SandboxConfigError
from plugins.runtime.startcounts import StartCounts
from plugins.runtime.termination import kill, pod_grace, victim

CRASHLOOP_INITIAL = 10.0  # the kubelet's initial CrashLoopBackOff
CRASHLOOP_MAX = 300.0  # MaxContainerBackOff
EXIT_SETTLE_SECONDS = 0.5
"""A container is restarted no sooner than this after its exit (see RuntimeSync._backoff)."""
RESYNC_SECONDS = 10.0
# The kubelet's io.kubernetes.container.type annotation per kind of start.
CONTAINER_TYPES = {"init": "init", "sidecar": "init", "container": "container", "ephemeral": "ephemeral"}
ERROR_RETRY_SECONDS = 10.0
STARTUP_POLL_SECONDS = 1.0  # the pod worker's backOffPeriod after a failed sync
FRESH_TIMEOUT_SECONDS = 10.0
# How containerd words a StartContainer whose caller went away: the gRPC context was cancelled,
# or the shim being started was killed with it. A real start failure (a missing executable, a
# permission) says something else and counts as a restart.
INTERRUPTED_START_MARKS = ("context canceled", "signal: killed")

SANDBOX_KEY = StashKey[tuple[str, t.PodSandboxConfig]]("runtime.sandbox")  # (id, the config it ran with)
ACTED_AT = StashKey[float]("runtime.acted_at")
BACKOFF = StashKey[Backoff]("runtime.crashloop")
EXIT_SEEN = StashKey[dict[str, float]]("runtime.exit_seen")
BACKED_OFF = StashKey[set[str]]("runtime.backed_off")


def acted(ctx: PodContext, expect: Expectation | None = None) -> None:
    """This stage changed the runtime: the next plan must come from a newer look at it.
    ``expect``: the change was a new sandbox, or a container's creation or start (its own event
    may show it: runtimeview.Expectation)."""
    ctx.stash[ACTED_AT] = time.time()
    ctx.request_relist(expect)


async def fresh(ctx: PodContext) -> PodRuntime:
    """What the relister shows, from a listing that began after this stage last acted
    (``seen_at`` is when the listing began). ``acted`` asked for that relist already."""
    since = ctx.stash.pop(ACTED_AT, None)
    if since is not None:
        with anyio.move_on_after(FRESH_TIMEOUT_SECONDS):
            while ctx.observed.seen_at <= since:
                # Our own change wakes us; a listing that shows no change is polled for.
                await ctx.runtime_changed(timeout=0.1)
    return ctx.observed


def go_duration(seconds: float) -> str:
    """Go's time.Duration formatting for whole seconds: 10s, 1m20s, 5m0s."""
    whole = int(seconds)
    minutes, secs = divmod(whole, 60)
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"


@dataclass
class Syncer:
    node_name: str
    ensure_sandbox: Callable[[PodContext], Awaitable[None]]
    pod_ip: Callable[[PodContext], str]
    image_ref: Callable[[PodContext, str], str]
    resizer: Resizer | None = None
    image_volumes: Callable[[PodContext, Container], Awaitable[Result | None]] | None = None
    """Ensures the images of the image volumes a container mounts, before it is created."""
    root_shared: bool = False
    """The root directory is on a shared mount (made so before the first Bidirectional mount)."""

    async def _share_root(self, ctx: PodContext) -> None:
        """The kubelet makes its root directory rshared at start (setupDataDirs, MakeRShared);
        we do it before the first container with a Bidirectional mount needs it, so that an
        agent that never runs one leaves the host's mount table as it found it. Raises OSError
        (the container's CreateContainerConfigError)."""
        if await anyio.to_thread.run_sync(make_rshared, Path(ctx.settings.root_dir)):
            ctx.log.info("made the root directory an rshared mount, for Bidirectional mount propagation",
                         root_dir=str(ctx.settings.root_dir))
        self.root_shared = True

    async def sync(self, ctx: PodContext) -> float:
        """One pass; returns how many seconds may pass before the next one is needed."""
        runtime = await fresh(ctx)
        if self.resizer is not None and await self.resizer.reconcile(ctx, runtime):
            acted(ctx)  # a container was killed for a resize: plan from a listing that shows it
            runtime = await fresh(ctx)
        source = restartall.trigger(ctx.pod, runtime, restartall.reset_at(ctx.facts))
        if source is not None:
            await self._restart_all(ctx, runtime, source)
            runtime = await fresh(ctx)
        here = {c.name: c.id for c in runtime.containers if c.running}
        unstarted = unstarted_sidecars(ctx.pod.spec, here, ctx.facts.get(STARTUP_PASSED) or set())
        todo = plan(ctx.pod, runtime, resize_restarts(ctx), since=restartall.reset_at(ctx.facts),
                    unstarted=unstarted)
        if todo.new_sandbox:
            return await self._replace_sandbox(ctx, runtime)
        if todo.kill_pod:
            await self._kill_running(ctx, runtime, "PodCompleted")
            return RESYNC_SECONDS
        wait = await self._start_all(ctx, todo)
        # A startup probe's success is no runtime change: look again soon while one is awaited.
        return min(wait, STARTUP_POLL_SECONDS) if unstarted else wait

    async def _start_all(self, ctx: PodContext, todo: Plan) -> float:
        soonest = RESYNC_SECONDS
        for step in todo.starts:
            wait = await self._start(ctx, step)
            if wait is None:
                continue
            soonest = min(soonest, wait)
            if step.blocking:
                break  # a regular init container that did not start holds back the rest
        return soonest

    # --- one container ------------------------------------------------------------------

    async def _start(self, ctx: PodContext, step: Step) -> float | None:
        """Start ``step``'s container; None when it started, else seconds until it may be tried
        again (back-off, or a failure to retry)."""
        latest = step.latest
        name = step.container.name
        if step.resume is not None:
            # Created but never started (created ahead at a barrier, or the agent died in
            # between): start that instance.
            return await self._start_created(ctx, step, step.resume.id)
        attempt = 0
        if latest is not None:
            attempt = max(c.attempt for c in ctx.observed.containers if c.name == name) + 1
            if latest.exited and self._interrupted(latest):
                # Our own StartContainer was cut off (the agent died mid-call): not the container
                # failing, so no restart is counted and no back-off applies. Replace the instance.
                await _remove(ctx, latest.id)
                attempt = latest.attempt
                latest = None
            elif latest.exited and not skip_backoff(ctx, latest.id):
                wait = await self._backoff(ctx, step, latest)
                if wait > 0:
                    return wait
        return await self._run(ctx, step, attempt, keep=latest.id if latest is not None else "")

    @staticmethod
    def _interrupted(c: ContainerRecord) -> bool:
        return (c.started_at == 0 and c.reason == "StartError"
                and any(mark in c.message for mark in INTERRUPTED_START_MARKS))

    async def _backoff(self, ctx: PodContext, step: Step, latest: ContainerRecord) -> float:
        """doBackOff: seconds the restart must still wait (then shows CrashLoopBackOff), or 0
        after recording the restart in the back-off."""
        pod = ctx.pod
        name = step.container.name
        key = f"{pod.metadata.name}_{pod.metadata.namespace}_{pod.uid}_{name}_{container_hash(step.container)}"
        # crashLoopBackOff.maxContainerRestartPeriod (KubeletCrashLoopBackOffMax): the longest
        # delay, and the first one too when it is shorter than 10 s.
        longest = ctx.settings.crash_loop_back_off.max_container_restart_period or CRASHLOOP_MAX
        backoff = ctx.stash.setdefault(BACKOFF, Backoff(min(CRASHLOOP_INITIAL, longest), longest))
        exited_at = _exit_time(ctx, latest)
        now = ctx.clock.monotonic()
        wait = backoff.remaining(key, exited_at, now)
        if wait <= 0:
            settle = latest.finished_at / 1e9 + EXIT_SETTLE_SECONDS - time.time() if latest.finished_at else 0.0
            if settle > 0:
                # Seen at once (the runtime's event stream): give the runtime a moment to show
                # what else is happening — a sandbox being stopped kills its containers first
                # and turns not-ready only later — before restarting into it (_run asks the
                # runtime whether the sandbox is still ready). Real time: it is the runtime's.
                await anyio.sleep(settle)
            backoff.next(key, exited_at, now)
            return 0.0
        message = (f"back-off {go_duration(backoff.current(key))} restarting failed container={name} "
                   f"pod={format_pod(pod)}")
        ctx.status.container_waiting(name, "CrashLoopBackOff", message)
        told = ctx.stash.setdefault(BACKED_OFF, set())
        if latest.id not in told:
            told.add(latest.id)
            await ctx.publish(ContainerBackedOff(container=name, container_id=latest.id, delay_seconds=wait,
                                                 message=f"Back-off restarting failed container {name} in pod "
                                                         f"{format_pod(pod)}"))
        return wait

    async def _run(self, ctx: PodContext, step: Step, attempt: int, keep: str) -> float | None:
        """startContainer: config, create, start, postStart (kuberuntime_container.go)."""
        created = await self._create(ctx, step, attempt, keep, starting=True)
        if not isinstance(created, str):
            return created
        return await self._start_created(ctx, step, created)

    async def create_ahead(self, ctx: PodContext) -> None:
        """Create, without starting, the containers the first pass would start: the first init
        container, or every regular one (Start.create_ahead). Only for a pod that never ran a
        container here: anything else (an agent restart, a restart) is the sync's to judge."""
        runtime = await fresh(ctx)
        if runtime.containers:
            return
        todo = plan(ctx.pod, runtime, since=restartall.reset_at(ctx.facts))
        if todo.new_sandbox or todo.kill_pod:
            return
        for step in todo.starts:
            if step.kind == "ephemeral":
                continue
            created = await self._create(ctx, step, 0, keep="")
            if not isinstance(created, str) or step.blocking or step.kind == "sidecar":
                break  # what comes after waits for this one to run (or to be retried by start)

    async def _create(self, ctx: PodContext, step: Step, attempt: int, keep: str, *,
                      starting: bool = False) -> str | float | None:
        """The config and CreateContainer: the new container's id, or what ``_run`` returns
        when it cannot be made (seconds until the next try). ``starting``: the caller starts the
        new container at once and asks for the relist then; one relist after a creation
        nothing plans from cost every container start two listings and a ContainerStatus."""
        # Created with the allocated resources: a resize not accepted yet must not start here.
        pod = allocated_pod(ctx)
        container = next((c for c in pod.all_containers() if c.name == step.container.name), step.container)
        name = container.name
        sandbox_id, sandbox_config = ctx.stash[SANDBOX_KEY]
        if keep and not await _sandbox_ready(ctx, sandbox_id):
            # A restart into a sandbox that is going away: stopping a sandbox kills its containers
            # first, and an event-driven relist can see the exit before the sandbox's state. The
            # next pass replaces the sandbox (init containers first), as the kubelet does.
            ctx.request_relist()
            return ERROR_RETRY_SECONDS
        ref = self.image_ref(ctx, name)
        if self.image_volumes is not None:
            problem = await self.image_volumes(ctx, container)
            if problem is not None:  # the container shows the pull's reason
                return problem.retry_after if problem.retry_after is not None else ERROR_RETRY_SECONDS
        # The kubelet keeps one dead instance per container (lastState); older ones go.
        for c in ctx.observed.containers:
            if c.name == name and c.id != keep and c.exited:
                await _remove(ctx, c.id)
        extra = ctx.additions.merged(name)
        unmounted = _unmounted(container, extra) if step.kind == "ephemeral" else []
        if unmounted:
            # The volume stages hand out mounts at prepare, for the containers the pod had then:
            # an ephemeral container added later would run without these (never silently).
            message = (f"volumeMounts of ephemeral container {name!r} are not supported by nodeagent: "
                       f"{', '.join(unmounted)}")
            await _failed(ctx, name, "CreateContainerConfigError", message)
            return ERROR_RETRY_SECONDS
        try:
            # subPaths and typed hostPaths: opened, checked and bound now, for this instance —
            # never what an earlier start (or prepare) saw, which a container may have changed.
            extra.mounts.extend(await anyio.to_thread.run_sync(bind_volume_mounts, ctx.pod_dir, name, extra.binds))
            # Image volumes: mounted by the runtime itself, from the image ensured in prepare.
            extra.mounts.extend(imagevolumes.mounts(ctx, pod, container))
            if wants_recursive_read_only(container):
                supported = await handler_supports_recursive_read_only(ctx)
                extra.mounts, made = with_recursive_read_only(container, extra.mounts, supported)
                notes_of(ctx.facts).recursive_read_only[name] = frozenset(made)
            if not self.root_shared and any(m.propagation == t.MountPropagation.PROPAGATION_BIDIRECTIONAL
                                            for m in extra.mounts):
                await self._share_root(ctx)
            message_file = create_message_file(ctx.pod_dir, name)
        except (VolumeBindError, OSError, ValueError) as exc:
            detail = exc.detail if isinstance(exc, VolumeBindError) else str(exc)
            ctx.log.warning("cannot prepare the container's mounts", container=name, error=detail)
            await _failed(ctx, name, "CreateContainerConfigError", str(exc))
            return ERROR_RETRY_SECONDS
        extra.mounts.append(message_mount(message_file, container.termination_message_path))
        if container.lifecycle is not None and container.lifecycle.pre_stop is not None:
            # So that a restarted agent can run the hook of a container its spec no longer names.
            extra.annotations[L.CONTAINER_PRESTOP_HANDLER] = json.dumps(
                container.lifecycle.pre_stop.model_dump(by_alias=True, exclude_none=True))
        try:
            config = container_config(pod, container, attempt, ref, self.node_name,
                                      container_type=CONTAINER_TYPES[step.kind],
                                      additions=extra, userns=_userns_of(sandbox_config),
                                      **await runtime_inputs(ctx, sandbox_id, ref))
        except CriError as exc:
            message_file.unlink(missing_ok=True)
            await _failed(ctx, name, "CreateContainerConfigError", str(exc.details or exc))
            return ERROR_RETRY_SECONDS
        except Exception as exc:  # noqa: BLE001 — the spec cannot be honoured (ContainerConfigError and kin)
            message_file.unlink(missing_ok=True)
            await _failed(ctx, name, "CreateContainerConfigError", str(exc))
            ctx.log.warning("cannot configure container", container=name, error=str(exc))
            return ERROR_RETRY_SECONDS
        try:
            container_id = await ctx.runtime.create_container(sandbox_id, config, sandbox_config)
        except CriError as exc:
            acted(ctx)
            message_file.unlink(missing_ok=True)
            await _failed(ctx, name, "CreateContainerError", str(exc.details or exc))
            ctx.log.warning("creating container failed", container=name, error=str(exc))
            return ERROR_RETRY_SECONDS
        except BaseException:
            acted(ctx)  # cancelled mid-call: the runtime may hold the container all the same
            raise
        if not starting:
            acted(ctx, expect=(container_id, "created"))  # else _start_created's, whatever it starts
        record_created(ctx, container_id, container)
        await ctx.publish(ContainerCreated(container=name, container_id=container_id, attempt=attempt))
        return container_id

    async def _start_created(self, ctx: PodContext, step: Step, container_id: str) -> float | None:
        """StartContainer, then postStart; as ``_start`` returns."""
        name = step.container.name
        try:
            await _start_container(ctx, container_id)
        except CriError as exc:
            acted(ctx)
            # The instance is left exited (containerd: StartError, exit 128); the next pass
            # restarts it per the policy, with back-off, as the kubelet does.
            await _failed(ctx, name, "RunContainerError", str(exc.details or exc))
            ctx.log.warning("starting container failed", container=name, error=str(exc))
            return 0.0
        except BaseException:
            acted(ctx)
            raise
        acted(ctx, expect=(container_id, "running"))
        return await self._post_start(ctx, step, container_id)

    async def _post_start(self, ctx: PodContext, step: Step, container_id: str) -> float | None:
        container = step.container
        hook = container.lifecycle.post_start if container.lifecycle is not None else None
        if hook is None:
            ctx.status.clear_container_waiting(container.name)
            return None
        notes = notes_of(ctx.facts)
        notes.post_start_running.add(container_id)
        notes.touch()
        target = HookTarget(pod=format_pod(ctx.pod), container=container.name, container_id=container_id,
                            pod_ip=self.pod_ip(ctx), ports=tuple(container.ports))
        try:
            # Synchronous, without a timeout: nothing after this container starts until the
            # hook returned, and the container is not reported started before.
            await run_hook(ctx.runtime, hook, target)
        except HookError as exc:
            ctx.log.warning("postStart hook failed; killing the container", container=container.name, error=str(exc))
            await ctx.publish(HookFailed(container=container.name, container_id=container_id, hook="PostStart",
                                         reason="FailedPostStartHook", message="PostStartHook failed"))
            await kill(ctx, [victim(ctx.pod, container_id, container.name)], pod_grace(ctx.pod),
                       "FailedPostStartHook", self.pod_ip(ctx))
            acted(ctx)
            ctx.status.container_waiting(container.name, "PostStartHookError", str(exc))
            return 0.0
        finally:
            notes.post_start_running.discard(container_id)
            notes.touch()
        ctx.status.clear_container_waiting(container.name)
        return None

    # --- the pod as a whole -------------------------------------------------------------

    async def _kill_running(self, ctx: PodContext, runtime: PodRuntime, reason: str) -> None:
        running = [victim(ctx.pod, c.id, c.name) for c in runtime.containers if c.running]
        if running:
            await kill(ctx, running, pod_grace(ctx.pod), reason, self.pod_ip(ctx))
            acted(ctx)

    async def _restart_all(self, ctx: PodContext, runtime: PodRuntime, source: ContainerRecord) -> None:
        """A RestartAllContainers rule matched ``source``'s exit: stop everything that runs,
        then (the next plans) run the pod again from its first init container."""
        ctx.log.info("restarting all containers", container=source.name, exit_code=source.exit_code)
        restartall.begin(ctx.facts)
        await self._kill_running(ctx, runtime, restartall.REASON)
        acted(ctx)

    async def _replace_sandbox(self, ctx: PodContext, runtime: PodRuntime) -> float:
        """The sandbox died (or vanished): kill what is left, run a new one; the next passes run
        the init containers again in it, then the containers the policy restarts."""
        await self._kill_running(ctx, runtime, "SandboxChanged")
        for sandbox in runtime.sandboxes:
            if sandbox.ready:
                try:
                    await ctx.runtime.stop_pod_sandbox(sandbox.id)
                except NotFound:
                    pass
        ctx.log.info("pod sandbox changed; running a new one")
        try:
            await self.ensure_sandbox(ctx)
        except Exception as exc:  # noqa: BLE001 — CRI errors, a sandbox the spec cannot describe: try later
            ctx.log.warning("running a new sandbox failed", error=str(exc))
            return ERROR_RETRY_SECONDS
        finally:
            acted(ctx)
        return 0.0


async def handler_supports_recursive_read_only(ctx: PodContext) -> bool:
    """runtimeClassSupportsRecursiveReadOnlyMounts: the pod's runtime handler says so in CRI
    Status (a runtime that lists no handlers, as containerd 1.6, supports it for none). Asked
    only for a container that wants it: no other start pays for the Status call."""
    try:
        handler = await handler_of(ctx)
    except SandboxConfigError:
        return False
    found = (await ctx.runtime.capabilities()).handler(handler)
    return bool(found is not None and found.features is not None and found.features.recursive_read_only_mounts)


async def _failed(ctx: PodContext, name: str,
                  reason: Literal["CreateContainerConfigError", "CreateContainerError", "RunContainerError"],
                  message: str) -> None:
    """The container's waiting reason, and the fact (the kubelet's Warning "Failed" event)."""
    StartCounts.container_failed(ctx)
    ctx.status.container_waiting(name, reason, message)
    await ctx.publish(ContainerFailed(container=name, reason=reason, message=message))


def _exit_time(ctx: PodContext, record: ContainerRecord) -> float:
    """When ``record`` exited, on the stage clock's scale. The runtime's finishedAt is wall time;
    its age is carried over to the clock when the exit is first seen, so a manual clock in
    tests moves back-off time while the runtime's timestamps stay real."""
    seen = ctx.stash.setdefault(EXIT_SEEN, {})
    if record.id not in seen:
        age = max(0.0, time.time() - record.finished_at / 1e9) if record.finished_at else 0.0
        seen[record.id] = ctx.clock.monotonic() - age
    return seen[record.id]


async def _remove(ctx: PodContext, container_id: str) -> None:
    try:
        await ctx.runtime.remove_container(container_id)
    except NotFound:
        pass
    acted(ctx)
    ctx.stash.get(EXIT_SEEN, {}).pop(container_id, None)
    ctx.stash.get(BACKED_OFF, set()).discard(container_id)


__all__ = ["SANDBOX_KEY", "Syncer", "acted", "fresh", "go_duration"]


async def _sandbox_ready(ctx: PodContext, sandbox_id: str) -> bool:
    """The runtime's word, not the last listing's: is the sandbox still ready?"""
    try:
        status = await ctx.runtime.pod_sandbox_status(sandbox_id)
    except NotFound:
        return False
    return bool(status.state == t.PodSandboxState.SANDBOX_READY)
def _unmounted(container: Container, extra: ContainerAdditions) -> list[str]:
    """The container's volumeMounts no stage added a mount for ("volume at path")."""
    provided = {m.container_path for m in extra.mounts} | {b.container_path for b in extra.binds}
    return [f"{m.name} at {m.mount_path}" for m in container.volume_mounts if m.mount_path not in provided]


async def _start_container(ctx: PodContext, container_id: str) -> None:
    """StartContainer, not abandoned half-way: cancelled on our side (a kill cancels the observe
    loop), the start still completes in containerd, after the stop phase listed the container as
    merely created — and a container nobody stops runs on past its pod's teardown (the fuzzer
    found cleanup's RemoveContainer refused: "cannot delete running task"). The call is bounded
    by the runtime request timeout; the cancellation lands right after it, and the stop phase
    then sees the container running. (The kubelet never cuts a sync off mid-call either.)"""
    with anyio.CancelScope(shield=True):
        await ctx.runtime.start_container(container_id)


def _userns_of(config: t.PodSandboxConfig) -> t.UserNamespace | None:
    """The sandbox's user namespace options, which each container repeats (as the kubelet's)."""
    linux = config.linux
    sc = linux.security_context if linux is not None else None
    options = sc.namespace_options if sc is not None else None
    return options.userns_options if options is not None else None
