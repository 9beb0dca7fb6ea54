"""The runtime stage: images and the sandbox (prepare), the pod's containers (start, then the
observe loop), their termination (stop), and the reverse (unprepare, cleanup) — all through CRI.

The containers are driven the kubelet's way, by a sync loop (sync.py): each pass plans from
what the runtime shows (plan.py) and acts. ``start`` runs the first pass; ``observe`` runs the
next ones whenever the runtime changes or a back-off ends. So init containers run one at a
time, in order, each to success; sidecars (init containers with restartPolicy Always) start in
order and are kept running; regular containers start in order once the pod is initialized,
each after the previous one's postStart hook returned; exited containers restart per
restartPolicy with CrashLoopBackOff; a dead sandbox is replaced and the init containers run
again; sidecars of a pod whose regular containers are done are stopped, last to first.
``stop`` kills the containers with preStop hooks within the grace period, sidecars last
(termination.py).

Every step first looks at what the runtime already has for the pod (found by the kubelet's
labels), so that a restarted agent adopts its sandbox and containers instead of duplicating
them, and so that every undo is idempotent.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any, ClassVar

import anyio
import anyio.abc
import structlog

from cri import AlreadyExists, CriError, NotFound
from cri import types as t
from nodeagent import hostpaths
from nodeagent import labels as L
from nodeagent.additions import CONTAINER_ADDITIONS
from nodeagent.events import SandboxRemoved, SandboxStarted
from nodeagent.kube.runtimeclass import check as runtimeclass_check
from nodeagent.model import Container
from nodeagent.mounttable import mounts_under
from nodeagent.objects import kinds
from nodeagent.pluginconfig import NoConfig
from nodeagent.podfacts import RESIZE, RESTART_ALL_AT, RUNTIME_NOTES, STARTUP_PASSED, notes_of
from nodeagent.stages import (
    AgentHandle,
    Cleanup,
    Observe,
    PodContext,
    Prepare,
    Result,
    Start,
)
from nodeagent.stash import StashKey
from nodeagent.volumebind import unbind_pod
from nodeagent.waits import first_of
from plugins.runtime import imagevolumes, podcgroup, seen
from plugins.runtime.images import ImagePuller
from plugins.runtime.nodekeyring import NodeKeyring
from plugins.runtime.pullrecords import PullRecords
from plugins.runtime.pullsecrets import PullSecrets
from plugins.runtime.resize import Ledger, Resizer, allocated_pod, ensure_state
from plugins.runtime.runtimeclass import handler_of
from plugins.runtime.sandbox import SandboxConfigError, grpc_error_text, log_directory, sandbox_config
from plugins.runtime.startcounts import StartCounts
from plugins.runtime.sync import RESYNC_SECONDS, SANDBOX_KEY, Syncer, acted
from plugins.runtime.termination import kill, victim
from plugins.runtime.userns import IDS_PER_POD, RangeError, UserNamespaces, kubelet_range

log = structlog.get_logger("nodeagent.runtime")

SANDBOX = SANDBOX_KEY
IMAGE_REFS = StashKey[dict[str, str]]("runtime.image_refs")
POD_IP = StashKey[str]("runtime.pod_ip")
STARTING_WAIT_SECONDS = 30.0
ORPHAN_SWEEP_SECONDS = 60.0
ORPHAN_MIN_AGE_SECONDS = 60.0


class RuntimeStage(Prepare, Start, Observe, Cleanup):
    name: ClassVar[str] = "runtime"
    provides = (RUNTIME_NOTES, RESIZE, RESTART_ALL_AT)
    uses = (STARTUP_PASSED, CONTAINER_ADDITIONS)

    def __init__(self, node_name: str, pod_logs_dir: Path, node_keyring: NodeKeyring | None = None,
                 pull_records: PullRecords | None = None, *, userns: UserNamespaces,
                 pod_cgroups: bool = True, pods_root: str = podcgroup.DEFAULT_ROOT) -> None:
        self._node = node_name
        self._logs = pod_logs_dir
        self._userns = userns
        self._pod_cgroups = pod_cgroups
        """cgroupsPerQOS: False makes, writes, removes and sweeps no pod cgroup."""
        self._pods_root = pods_root
        """The cgroup the pod cgroups are under (podcgroup.pods_root): what the sweep walks."""
        self._tier_lock = anyio.Lock()
        self._tier_milli: int | None = None
        """The Burstable tier's size last written (None: not yet, or the write failed)."""
        self._images = ImagePuller.new(node_keyring, pull_records)
        self._ledger = Ledger()
        self._sandboxes_run: set[str] = set()
        """Pods (UIDs) this agent has asked RunPodSandbox for, until their cleanup removed every
        sandbox: only for these can the runtime hold a sandbox the relister's first listing did
        not show (see _existing_sandboxes)."""
        self.starts = StartCounts()
        self._sync = Syncer(node_name, self._ensure_sandbox, self._pod_ip_of, self._image_ref,
                            Resizer(self._ledger), self._image_volumes)

    def render_metrics(self) -> str:
        return self.starts.render_metrics()

    # --- the node-level task: orphaned pod cgroups ---------------------------------------------

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """At start, the QoS tiers; then every minute, the cgroups of pods this stage no longer
        runs, idle and over a minute old (the kubelet's cleanupOrphanedPodCgroups; part of
        container GC)."""
        task_status.started()
        if not self._pod_cgroups:
            return  # no pod cgroups: none can be orphaned
        await self._size_tiers(create=True)
        while True:
            await anyio.sleep(ORPHAN_SWEEP_SECONDS)
            await self._size_tiers()  # a resize changes a pod's requests without a start or stop
            try:
                removed = await anyio.to_thread.run_sync(podcgroup.sweep, self._ledger.uids(),
                                                         ORPHAN_MIN_AGE_SECONDS, time.time(), self._pods_root)
            except OSError as exc:
                log.warning("pod cgroup sweep failed", error=str(exc))
                continue
            if removed:
                log.info("removed the cgroups of pods no longer running", pods=removed)

    # --- prepare: images, then the sandbox ------------------------------------------------

    async def prepare(self, ctx: PodContext) -> Result:
        notes_of(ctx.facts)  # made now: the status stage watches them from its first pass
        refs: dict[str, str] = {}
        secrets = PullSecrets(ctx)
        for container in ctx.pod.all_containers():
            ref, problem = await self._images.ensure(ctx, container, secrets)
            if problem is not None:
                return problem
            ctx.status.clear_container_waiting(container.name)
            refs[container.name] = ref
        ctx.stash[IMAGE_REFS] = refs
        # Image volumes before any container starts (the kubelet pulls them before its first
        # container start, too); mounted by the runtime at each container's creation. One that
        # failed holds back only its containers, which try again at their start.
        await imagevolumes.ensure(ctx, self._images, secrets)
        await self._ensure_sandbox(ctx)
        return Result.ok()

    async def _ensure_sandbox(self, ctx: PodContext) -> None:
        pod = ctx.pod
        sandboxes = await self._existing_sandboxes(ctx)
        ready = sorted((s for s in sandboxes if s.state == t.PodSandboxState.SANDBOX_READY),
                       key=lambda s: s.created_at, reverse=True)
        await self._remove_empty_leftovers(ctx, [s for s in sandboxes if not ready or s.id != ready[0].id])
        if ready:
            # A sandbox that runs already keeps the handler it runs under (its class may be gone).
            sandbox = ready[0]
            userns = await self._userns.options(ctx, sandbox.runtime_handler)
            attempt = sandbox.metadata.attempt if sandbox.metadata else 0
            config = sandbox_config(pod, attempt, self._logs, self._node, settings=ctx.settings, userns=userns)
            ctx.stash[SANDBOX] = (sandbox.id, config)
            ctx.stash[POD_IP] = await self._sandbox_ip(ctx, sandbox.id)
            acted(ctx)  # nothing changed, but the first plan must see this sandbox
            await ctx.publish(SandboxStarted(sandbox_id=sandbox.id, attempt=attempt, adopted=True,
                                             pod_ip=ctx.stash[POD_IP]))
            return
        if sandboxes and pod.spec.restart_policy == "Never" and await self._containers(ctx):
            # The kubelet's "do not recreate" rule (computePodActions): a pod that ran under
            # Never and lost its sandbox — or completed before an agent restart — gets no new
            # one; the sync loop's plan then ends it.
            newest = max(sandboxes, key=lambda s: s.created_at)
            attempt = newest.metadata.attempt if newest.metadata else 0
            ctx.stash[SANDBOX] = (newest.id, sandbox_config(pod, attempt, self._logs, self._node,
                                                            settings=ctx.settings))
            acted(ctx)
            return
        attempt = max((s.metadata.attempt + 1 for s in sandboxes if s.metadata), default=0)
        with self.starts.sandbox_creation(ctx):
            sandbox_id, config = await self._create_sandbox(ctx, attempt)
        ctx.stash[SANDBOX] = (sandbox_id, config)
        acted(ctx, expect=(sandbox_id, "ready"))
        ctx.stash[POD_IP] = await self._sandbox_ip(ctx, sandbox_id)
        await ctx.publish(SandboxStarted(sandbox_id=sandbox_id, attempt=attempt, pod_ip=ctx.stash[POD_IP]))

    async def _existing_sandboxes(self, ctx: PodContext) -> list[t.PodSandbox]:
        """The pod's sandboxes before the stage ensures one. A pod this agent never ran a sandbox
        for, and that the relister's records (a node-wide listing since the agent started, and
        the events since) show none of, has none: a sandbox of it from before the agent started
        would have been in that listing, and only this stage makes new ones. Its first start
        then skips a ListPodSandbox (the kubelet's pod cache answers the same question there)."""
        observed = ctx.observed
        if ctx.ref.uid not in self._sandboxes_run and observed.seen_at > 0 and not observed.sandboxes:
            return []
        return await self._sandboxes(ctx)

    async def _create_sandbox(self, ctx: PodContext, attempt: int) -> tuple[str, t.PodSandboxConfig]:
        pod = ctx.pod
        # The kubelet resolves the handler and the user namespace in generatePodSandboxConfig:
        # an unknown class or a handler without user namespaces fails here, before anything runs.
        handler = await handler_of(ctx)
        userns = await self._userns.options(ctx, handler)
        config = sandbox_config(pod, attempt, self._logs, self._node, settings=ctx.settings, userns=userns)
        try:
            log_directory(self._logs, pod).mkdir(parents=True, exist_ok=True, mode=0o755)
        except OSError as exc:
            # The kubelet's pod log directory is <namespace>_<name>_<uid>: valid names can make it
            # longer than a file name may be. As the kubelet, the pod stays Pending and retries.
            raise SandboxConfigError(f"Failed to create pod sandbox: cannot create the pod log directory: "
                                     f"{exc.strerror}") from None
        await self._pod_cgroup(ctx)
        self._sandboxes_run.add(ctx.ref.uid)  # before the call: one that fails may still have made it
        try:
            return await ctx.runtime.run_pod_sandbox(config, runtime_handler=handler), config
        except CriError as exc:
            if exc.retryable:
                raise
            # The kubelet's FailedCreatePodSandBox, with the runtime's own error (an unknown
            # handler: `no runtime for "x" is configured`); the pod stays Pending and retries.
            raise SandboxConfigError(f"Failed to create pod sandbox: {grpc_error_text(exc)}") from None

    async def _remove_empty_leftovers(self, ctx: PodContext, sandboxes: list[t.PodSandbox]) -> None:
        """Sandboxes other than the one the pod keeps and that hold no container are leftovers of
        a RunPodSandbox the agent did not see finish (it died mid-call): remove them, so that a
        pod has one sandbox. Those with containers stay until cleanup: their containers carry the
        pod's last states and logs."""
        if not sandboxes:
            return
        holding = {c.pod_sandbox_id for c in await self._containers(ctx)}
        for sandbox in sandboxes:
            if sandbox.id in holding:
                continue
            try:
                await ctx.runtime.stop_pod_sandbox(sandbox.id)
                await ctx.runtime.remove_pod_sandbox(sandbox.id)
            except NotFound:
                continue
            ctx.log.info("removed a leftover sandbox", sandbox_id=sandbox.id)

    async def _pod_cgroup(self, ctx: PodContext) -> None:
        """The pod cgroup with the allocated resources, before the sandbox runs in it (the
        kubelet's EnsureExists before RunPodSandbox)."""
        state = ensure_state(ctx)
        pod = allocated_pod(ctx)
        self._ledger.set(ctx.ref.uid, pod)
        if not self._pod_cgroups:
            return
        try:
            await podcgroup.apply(ctx, pod)
        except OSError as exc:
            # runc still makes the directories; only the pod-level values are missing.
            ctx.log.warning("cannot set the pod cgroup", error=str(exc))
            return
        state.pod_cgroup = podcgroup.pod_values(pod)
        state.pod_applied = pod.spec.resources
        await self._size_tiers()

    async def _size_tiers(self, *, create: bool = False) -> None:
        """The Burstable tier sized by the Burstable pods' requests, written only when that
        changed (a BestEffort or Guaranteed pod costs nothing here); serialised, so that the
        last write holds the ledger's latest sum. ``create`` (at start) makes the QoS tiers
        first, whatever was written before."""
        if not self._pod_cgroups:
            return
        async with self._tier_lock:
            milli = self._ledger.burstable_cpu_milli()
            if milli == self._tier_milli and not create:
                return
            write = podcgroup.ensure_qos_tiers if create else podcgroup.size_burstable_tier
            try:
                await anyio.to_thread.run_sync(write, self._pods_root, milli)
            except OSError as exc:
                log.warning("cannot make the QoS cgroups" if create else "cannot size the Burstable QoS cgroup",
                            root=self._pods_root, error=str(exc))
                self._tier_milli = None
                return
            self._tier_milli = milli

    @staticmethod
    async def _sandbox_ip(ctx: PodContext, sandbox_id: str) -> str:
        ips = await seen.sandbox_ips(ctx, sandbox_id)
        return ips[0] if ips else ""

    @staticmethod
    def _pod_ip_of(ctx: PodContext) -> str:
        """Where hooks reach the pod: the sandbox's IP; the node's for a host-network pod."""
        return ctx.stash.get(POD_IP, "") or (ctx.node.ip if ctx.pod.spec.host_network else "")

    async def _image_volumes(self, ctx: PodContext, container: Container) -> Result | None:
        return await imagevolumes.ensure_for(ctx, self._images, container)

    @staticmethod
    def _image_ref(ctx: PodContext, container: str) -> str:
        return ctx.stash.get(IMAGE_REFS, {}).get(container, "")

    async def unprepare(self, ctx: PodContext) -> None:
        self._ledger.release(ctx.ref.uid)  # no container of the pod runs any more
        for sandbox in await self._sandboxes(ctx):
            if sandbox.state == t.PodSandboxState.SANDBOX_READY:
                try:
                    await ctx.runtime.stop_pod_sandbox(sandbox.id)
                except NotFound:
                    pass
        # The subPath and hostPath binds this stage made at container starts (found in the
        # mount table: they may be an earlier agent's), before the volumes they point into go.
        left = await anyio.to_thread.run_sync(unbind_pod, ctx.pod_dir)
        if left:
            ctx.log.warning("volume binds still mounted", mounts=[str(p) for p in left])

    # --- start: the first pass of the sync loop --------------------------------------------

    async def start(self, ctx: PodContext) -> Result:
        if SANDBOX not in ctx.stash:
            return Result.retry("SandboxMissing", "no sandbox was prepared for the pod")
        # Whatever could not start now (back-off, a config error) shows as the container's
        # waiting reason and is retried by the observe loop, as the kubelet's next sync would.
        with self.starts.sync_pass(ctx):
            await self._sync.sync(ctx)
        return Result.ok()

    async def create_ahead(self, ctx: PodContext) -> None:
        if SANDBOX in ctx.stash:
            await self._sync.create_ahead(ctx)

    async def stop(self, ctx: PodContext, grace_period: float) -> None:
        running = [c for c in await self._containers(ctx) if c.state == t.ContainerState.CONTAINER_RUNNING]
        victims = [victim(ctx.pod, c.id, c.labels.get(L.CONTAINER_NAME, ""), dict(c.annotations)) for c in running]
        if victims:
            await kill(ctx, victims, int(grace_period), "Killing", self._pod_ip_of(ctx))

    # --- observe: the rest of the sync loop --------------------------------------------------

    async def observe(self, ctx: PodContext) -> None:
        while True:
            with self.starts.sync_pass(ctx):
                delay = await self._sync.sync(ctx)
            await _until_changed(ctx, delay)

    # --- cleanup ---------------------------------------------------------------------------

    async def cleanup(self, ctx: PodContext) -> None:
        for c in await self._containers(ctx):
            await _remove_container(ctx, c.id)
        for sandbox in await self._sandboxes(ctx):
            try:
                await ctx.runtime.stop_pod_sandbox(sandbox.id)
                await ctx.runtime.remove_pod_sandbox(sandbox.id)
            except NotFound:
                continue
            await ctx.publish(SandboxRemoved(sandbox_id=sandbox.id))
        self._sandboxes_run.discard(ctx.ref.uid)  # the runtime holds none of the pod's sandboxes now
        ctx.stash.pop(SANDBOX)
        self._ledger.release(ctx.ref.uid)
        self._images.forget(ctx.ref.uid)
        await anyio.to_thread.run_sync(self._userns.release, ctx.ref.uid)  # no sandbox holds its IDs now
        if self._pod_cgroups:
            # The tier first: once the pod's cgroup is gone, nothing of it is left in the sizes.
            await self._size_tiers()
            await podcgroup.remove(ctx.pod, ctx.settings)
        logs = hostpaths.pod_log_dir(self._logs, ctx.ref.namespace, ctx.ref.name, ctx.ref.uid)
        await anyio.to_thread.run_sync(lambda: shutil.rmtree(logs, ignore_errors=True))
        await anyio.to_thread.run_sync(_remove_pod_dir, ctx)

    # --- what the runtime has for this pod -------------------------------------------------

    async def _sandboxes(self, ctx: PodContext) -> list[t.PodSandbox]:
        found = await ctx.runtime.list_pod_sandbox(t.PodSandboxFilter(label_selector={L.POD_UID: ctx.ref.uid}))
        return [s for s in found if s.labels.get(L.MANAGED_BY) == self._node]

    async def _containers(self, ctx: PodContext) -> list[t.Container]:
        found = await ctx.runtime.list_containers(t.ContainerFilter(label_selector={L.POD_UID: ctx.ref.uid}))
        return [c for c in found if c.labels.get(L.MANAGED_BY) == self._node]


def _remove_pod_dir(ctx: PodContext) -> None:
    """The pod directory, unless something is still mounted in it: a bind there may be a
    hostPath, and removing into it would remove the host's files."""
    pod_dir = ctx.pod_dir
    unbind_pod(pod_dir)
    left = mounts_under(pod_dir)
    if left:
        ctx.log.warning("pod directory kept: still mounted in it", mounts=[str(p) for p in left])
        return
    shutil.rmtree(pod_dir, ignore_errors=True)


async def _remove_container(ctx: PodContext, container_id: str) -> None:
    """RemoveContainer, waiting out a StartContainer still in progress in containerd (ours, cut
    off by a cancellation): containerd refuses to remove a container while it is starting."""
    with anyio.move_on_after(STARTING_WAIT_SECONDS):
        while True:
            try:
                await ctx.runtime.remove_container(container_id)
                return
            except NotFound:
                return
            except CriError as exc:
                if "starting state" not in str(exc):
                    raise
            await anyio.sleep(0.1)


async def _until_changed(ctx: PodContext, seconds: float) -> None:
    """Until the relister sees a change for the pod, a new spec reaches it (a resize), or
    ``seconds`` pass on the stage's clock (a back-off ending), or a resync period passes."""
    if seconds <= 0:
        await anyio.lowlevel.checkpoint()
        return
    await first_of(ctx.runtime_changed(timeout=min(seconds, RESYNC_SECONDS)),
                   ctx.pod_changed(ctx.pod, seconds), ctx.clock.sleep(seconds))


def plugin(config: NoConfig, handle: AgentHandle) -> RuntimeStage:
    """Everything the runtime stage reads is the kubelet's: rootDir, podLogsDir, the image
    credential verification policy and allowlist."""
    settings = handle.settings
    root_dir = settings.root_dir
    # Without the KubeletEnsureSecretPulledImages gate there is no policy: nothing is verified.
    records = PullRecords(root_dir / "image_manager", settings.image_pull_credentials_verification_policy or
                          "NeverVerify", settings.preloaded_images_verification_allowlist or [])
    objects = getattr(handle, "objects", None)
    if objects is not None:
        # Standalone, a RuntimeClass manifest the API server would refuse is refused when read.
        objects.declare(kinds.RUNTIME_CLASS, runtimeclass_check)
    return RuntimeStage(handle.node.name, Path(settings.pod_logs_dir), NodeKeyring(root_dir, handle.clock.monotonic),
                        records, userns=node_user_namespaces(settings), pod_cgroups=podcgroup.enabled(settings),
                        pods_root=podcgroup.pods_root(settings))


def node_user_namespaces(settings: Any) -> UserNamespaces:
    """The node's user namespace IDs: userNamespaces.idsPerPod per pod, from the kubelet user's
    subordinate IDs or the default range. A range the kubelet would refuse to start with
    refuses only the pods that need it (hostUsers: false), with the kubelet's words."""
    configured = settings.user_namespaces.ids_per_pod if settings.user_namespaces is not None else None
    ids_per_pod = configured or IDS_PER_POD
    try:
        first, length = kubelet_range(ids_per_pod, settings.max_pods)
    except RangeError as exc:
        log.error("user namespaces unavailable: pods with hostUsers: false will be refused", error=str(exc))
        return UserNamespaces(settings.root_dir, ids_per_pod, ids_per_pod, ids_per_pod, broken=str(exc))
    return UserNamespaces(settings.root_dir, first, length, ids_per_pod)


plugin.stage_class = RuntimeStage  # type: ignore[attr-defined]
plugin.config_model = NoConfig  # type: ignore[attr-defined]
__all__ = ["AlreadyExists", "RuntimeStage", "plugin"]
