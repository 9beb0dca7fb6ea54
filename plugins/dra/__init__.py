"""The dra stage: Dynamic Resource Allocation devices for pods, as the kubelet's DRA manager.

prepare (before volumes and the sandbox): the pod's ResourceClaims (read from the API server for
a pod from the API server; from the manifests beside a static pod standalone: plugins/dra/claimfetch.py) must
be allocated and reserved for the pod (plugins/dra/claims.py); their drivers must be registered;
each driver gets one NodePrepareResources for the pod's claims it serves (45 s timeout); the CDI
device ids come back per claim and request, and each container naming a claim in
resources.claims gets them — in ContainerConfig.CDI_devices, and, for runtimes that do not
resolve CDI (containerd 1.6), as the devices, mounts and environment the CDI spec files describe.
Anything missing or failing is a RETRY with reason FailedPrepareDynamicResources and the
kubelet's message, shown as the pod's reason while it waits; only this pod waits.

unprepare (only once no container of the pod runs): the pod lets go of its claims; a claim no
pod uses any more gets NodeUnprepareResources. A claim shared by several pods is prepared once
and unprepared after the last of them. What is prepared is checkpointed (plugins/dra/state.py)
before and after each driver call, so a restarted agent knows what to unprepare and adopts what
running pods use.

The stage's node-level task (:meth:`DraStage.run`, started by the agent) registers drivers
(plugins/dra/registration.py) and, every ``reconcilePeriodSeconds``, unprepares claims left
behind: those of pods that disappeared while the agent was down, and those whose unprepare
failed (driver not registered at the time). In cluster mode it also keeps the node's
ResourceSlices honest (plugins/dra/slices.py): stale ones go at start, a vanished driver's after
``sliceWipeDelaySeconds``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal

import anyio
import structlog
from pydantic import Field

from cri import CriError
from nodeagent import labels as L
from nodeagent.additions import CONTAINER_ADDITIONS
from nodeagent.events import Event
from nodeagent.objects import kinds
from nodeagent.pluginconfig import PluginConfig
from nodeagent.stages import AgentHandle, PodContext, Prepare, Result
from nodeagent.stash import StashKey
from nodeagent.statefile import quarantine
from plugins.dra import api, claimfetch, containers
from plugins.dra.cdi import CdiError, CdiSpecs
from plugins.dra.claims import ClaimNotReady, PodClaim, pod_claims
from plugins.dra.events import (
    CdiEditsSkipped,
    DevicesPrepared,
    DevicesUnprepared,
    DraCheckpointDiscarded,
    DraDriverDeregistered,
    DraDriverRegistered,
)
from plugins.dra.registration import DraRegistrations, Drivers
from plugins.dra.resourceclaim import ResourceClaim
from plugins.dra.slices import WIPE_DELAY_SECONDS, SliceWiper
from plugins.dra.state import CheckpointError, ClaimCache, ClaimEntry

log = structlog.get_logger("nodeagent.dra")

REASON = "FailedPrepareDynamicResources"  # the kubelet's event reason
CDI_CONDITION = "nodeagent.io/CDIEditsSkipped"
_WAITING = StashKey[str]("dra.waiting")
"""The message the pod was last shown while waiting (cleared on success)."""


class DraConfig(PluginConfig):
    cdi_spec_dirs: list[Path] = Field(default_factory=lambda: [Path("/etc/cdi"), Path("/var/run/cdi")])
    """CDI spec directories, lowest priority first (a device in a later one overrides), as
    containerd's cdi_spec_dirs; read for runtimes that do not resolve CDI themselves."""
    checkpoint_file: Path | None = None
    """The prepared ResourceClaims, kept across restarts; default ``<rootDir>/dra_manager_state``."""
    poll_seconds: float = Field(default=1.0, gt=0)
    """How often the plugins-registry directory is looked at (the kubelet's reconciler: 1 s)."""
    health_check_seconds: float = Field(default=10.0, gt=0)
    """How often registered plugins are asked GetInfo; silent twice in a row → deregistered."""
    call_timeout_seconds: float = Field(default=api.CALL_TIMEOUT_SECONDS, gt=0)
    reconcile_period_seconds: float = Field(default=60.0, gt=0)
    """How often claims nobody uses are unprepared (the kubelet's defaultReconcilePeriod)."""
    slice_wipe_delay_seconds: float = Field(default=WIPE_DELAY_SECONDS, ge=0)
    """Cluster mode: how long after a driver's deregistration its ResourceSlices of the node are
    deleted, unless it registers again (the kubelet's 30 s)."""
    resolve_cdi: Literal["auto", "always", "never"] = "auto"
    """Turn CDI specs into CRI devices/mounts/env ourselves: ``auto`` does unless the runtime
    is containerd 2 or later, which resolves CDI_devices itself (doing both would apply twice)."""


class DraStage(Prepare):
    name: ClassVar[str] = "dra"
    provides = (CONTAINER_ADDITIONS,)

    def __init__(self, config: DraConfig, handle: AgentHandle) -> None:
        self.config = config
        self.drivers = Drivers()
        objects = getattr(handle, "objects", None)
        self.slices = (SliceWiper(objects, handle.node.name, config.slice_wipe_delay_seconds)
                       if objects is not None and objects.cluster else None)
        self.registrations = DraRegistrations(self.drivers, self._registration,
                                              call_timeout=config.call_timeout_seconds,
                                              poll_seconds=config.poll_seconds,
                                              health_seconds=config.health_check_seconds)
        self.cache = ClaimCache(config.checkpoint_file or handle.settings.root_dir / "dra_manager_state")
        self.cdi = CdiSpecs(list(config.cdi_spec_dirs))
        if objects is not None:
            # Standalone, claim manifests this stage cannot read are refused when read.
            objects.declare(kinds.RESOURCE_CLAIM, ResourceClaim.check)
        self._handle = handle
        self._loaded = False
        self._locks: dict[str, anyio.Lock] = {}
        self._active: set[str] = set()
        """Pods prepared by this process and not unprepared since (for the reconcile loop)."""

    # --- node level ---------------------------------------------------------------------

    def registration_handlers(self) -> list[DraRegistrations]:
        """Plugins of type DRAPlugin, handed over by the agent's plugin watcher."""
        return [self.registrations]

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """The node-level task: the reconcile loop and (cluster mode) the node's ResourceSlice
        housekeeping (the agent's plugin watcher registers the drivers)."""
        await self._ensure_loaded()
        async with anyio.create_task_group() as tg:
            if self.slices is not None:
                await tg.start(self.slices.run)
            tg.start_soon(self._reconcile_loop)
            task_status.started()

    async def _registration(self, event: Event) -> None:
        """What the plugin watcher reports goes on the bus; in cluster mode it also schedules
        (or calls off) the wipe of a deregistered driver's ResourceSlices."""
        if self.slices is not None:
            if isinstance(event, DraDriverRegistered):
                self.slices.registered(event.driver)
            elif isinstance(event, DraDriverDeregistered) and self.drivers.get(event.driver) is None:
                self.slices.deregistered(event.driver)
        await self._handle.publish(event)

    def describe(self) -> dict[str, Any]:
        """For the agent's /plugins: registered drivers and prepared claims."""
        return {"drivers": [{"name": d.name, "endpoint": d.endpoint, "service": d.service, "socket": d.socket,
                             "registeredAt": d.registered_at} for d in self.drivers.all()],
                "claims": [{"claim": e.key, "uid": e.uid, "pods": sorted(e.pod_uids), "drivers": sorted(e.drivers),
                            "prepared": e.prepared} for e in self.cache.entries.values()]}

    async def _ensure_loaded(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        try:
            await anyio.to_thread.run_sync(self.cache.load)
        except CheckpointError as exc:
            # The kubelet refuses to start on a corrupted checkpoint; a node agent that cannot
            # start helps nobody. Keep the file for a human, say so loudly, start empty.
            aside = quarantine(self.cache.path, "DRA checkpoint (claims prepared before may leak)", str(exc))
            await self._handle.publish(DraCheckpointDiscarded(source="dra", path=str(aside or self.cache.path),
                                                              message=str(exc)))

    async def _reconcile_loop(self) -> None:
        while True:
            await anyio.sleep(self.config.reconcile_period_seconds)
            await self.reconcile()

    async def reconcile(self) -> None:
        """Drop pods that are gone from claims (no worker prepared them since the agent started
        and the runtime has no sandbox for them), then unprepare claims nobody uses."""
        await self._ensure_loaded()
        try:
            sandboxes = await self._handle.runtime.list_pod_sandbox()
        except CriError as exc:
            log.warning("DRA reconcile skipped: cannot list sandboxes", error=str(exc))
            return
        node = self._handle.node.name
        present = {s.labels.get(L.POD_UID, "") for s in sandboxes if s.labels.get(L.MANAGED_BY) == node}
        changed = False
        for entry in self.cache.entries.values():
            gone = {uid for uid in entry.pod_uids if uid not in self._active and uid not in present}
            if gone:
                log.info("DRA claim released by pods that no longer exist", claim=entry.key, pods=sorted(gone))
                entry.pod_uids -= gone
                changed = True
        if changed:
            await self._save()
        await self._unprepare_unused()

    # --- prepare ------------------------------------------------------------------------

    async def prepare(self, ctx: PodContext) -> Result:
        await self._ensure_loaded()
        pod = ctx.pod
        if not pod.spec.resource_claims:
            ctx.additions.withdraw()
            return Result.skip()
        try:
            claims = await self._pod_claims(ctx)
        except ClaimNotReady as exc:
            return self._waiting(ctx, str(exc))
        # A claim a running pod adopts after an agent restart needs no driver call, hence no driver.
        missing = sorted({d for c in claims if not self._adoptable(ctx, self.cache.entries.get(c.uid))
                          for d in c.claim.drivers() if self.drivers.get(d) is None})
        if missing:
            return self._waiting(ctx, f"DRA driver {missing[0]} is not registered")
        self._active.add(pod.uid)
        resolve_cdi = await self._resolve_cdi()
        if resolve_cdi:
            await anyio.to_thread.run_sync(self.cdi.refresh)
        async with self._locked([c.uid for c in claims]):
            errors, released = await self._prepare_locked(ctx, claims, resolve_cdi)
        if released:
            await self._unprepare_unused()  # the old object of an edited claim manifest
        if errors:
            return self._waiting(ctx, "; ".join(errors))
        try:
            ids = containers.cdi_ids_per_container(pod, claims, self.cache)
            if resolve_cdi and ids:
                await anyio.to_thread.run_sync(self.cdi.refresh)  # the specs the drivers just wrote
            table = containers.resolve(ids, self.cdi if resolve_cdi else None)
        except CdiError as exc:
            # The driver's spec is gone or broken (a reboot emptied /var/run/cdi?): ask the driver
            # again on the retry; NodePrepareResources is idempotent and rewrites it.
            for claim in claims:
                entry = self.cache.entries.get(claim.uid)
                if entry is not None:
                    entry.prepared = False
            return self._waiting(ctx, str(exc))
        containers.apply(ctx.additions, table)
        await self._report_skipped(ctx, table)
        if ctx.stash.pop(_WAITING, None) is not None:
            ctx.status.set_pod_reason("", "")
        return Result.ok()

    async def _pod_claims(self, ctx: PodContext) -> list[PodClaim]:
        """The pod's claims, read now and checked: a pod from the API server by the kubelet's rules;
        a static pod's (which nobody reserved a claim for) loosely."""
        pod = ctx.pod
        if not ctx.objects.cluster or pod.metadata.annotations.get(L.CONFIG_SOURCE) == "file":
            return pod_claims(pod, await claimfetch.fetch(ctx.objects, pod), ctx.node.name)
        pod = await claimfetch.with_claim_statuses(ctx.objects, pod)
        return pod_claims(pod, await claimfetch.fetch(ctx.objects, pod), ctx.node.name, from_api=True)

    async def _prepare_locked(self, ctx: PodContext, claims: list[PodClaim],
                              check_cdi: bool) -> tuple[list[str], bool]:
        """Record the intent, call the drivers for what is not prepared, record the answers.
        Returns the errors, and whether the pod let go of an older object of one of its claims."""
        uid = ctx.pod.uid
        adoptable: set[str] = set()
        released = False
        for claim in claims:
            entry = self.cache.entries.get(claim.uid)
            if entry is None:
                stale = self.cache.by_name(*claim.claim.key)
                if stale is not None and stale.pod_uids - {uid}:
                    return [(f"old ResourceClaim with same name {claim.key} and different UID {stale.uid} still "
                             "exists (previous pod deleted?)")], released
                if stale is not None:  # an edited claim manifest: this pod used the old object
                    stale.pod_uids.discard(uid)
                    released = True
                entry = self.cache.entries[claim.uid] = ClaimEntry(
                    claim.uid, claim.claim.metadata.name, claim.claim.metadata.namespace,
                    drivers={d: [] for d in claim.claim.drivers()})
            elif self._adoptable(ctx, entry):
                adoptable.add(claim.uid)
            entry.pod_uids.add(uid)
        await self._save()  # the intent first: a crash during the calls must not leak them

        todo: dict[str, list[ClaimEntry]] = {}
        for claim in claims:
            entry = self.cache.entries[claim.uid]
            # Adopted only while its CDI specs are still there (a reboot empties /var/run/cdi).
            if claim.uid in adoptable and (not check_cdi or all(self.cdi.has(i) for d in entry.devices()
                                                                 for i in d.cdi_device_ids)):
                entry.restored = False
                for driver_name, devices in entry.drivers.items():
                    await ctx.publish(DevicesPrepared(driver=driver_name, claims=[entry.key], adopted=True,
                                                      cdi_device_ids=[i for d in devices for i in d.cdi_device_ids]))
                continue
            if entry.prepared and not entry.restored:
                continue
            for driver_name in entry.drivers:
                todo.setdefault(driver_name, []).append(entry)
        errors: list[str] = []
        failed: set[str] = set()
        for name, entries in todo.items():
            driver = self.drivers.get(name)
            if driver is None:
                errors.append(f"DRA driver {name} is not registered")
                failed |= {e.uid for e in entries}
                continue
            try:
                answers = await driver.client.prepare([e.claim for e in entries])
            except api.DriverCallError as exc:
                errors.append(f"NodePrepareResources: {exc}")
                failed |= {e.uid for e in entries}
                continue
            done = []
            for entry in entries:
                answer = answers[entry.uid]
                if answer.error:
                    errors.append(f"NodePrepareResources failed for ResourceClaim {entry.key}: {answer.error}")
                    failed.add(entry.uid)
                    entry.drivers[name] = []
                else:
                    entry.drivers[name] = list(answer.devices)
                    done.append(entry)
            if done:
                await ctx.publish(DevicesPrepared(driver=name, claims=[e.key for e in done],
                                                  cdi_device_ids=[i for e in done for d in e.drivers[name]
                                                                  for i in d.cdi_device_ids]))
        for entries in todo.values():
            for entry in entries:
                entry.prepared = entry.uid not in failed
                entry.restored = False
        if todo:
            await self._save()
        return errors, released

    @staticmethod
    def _adoptable(ctx: PodContext, entry: ClaimEntry | None) -> bool:
        """Prepared by the previous agent for this pod, whose sandbox still runs: the kubelet
        prepares claims only when it creates a sandbox, so neither do we."""
        return (entry is not None and entry.restored and entry.prepared and ctx.ref.uid in entry.pod_uids
                and ctx.observed.ready_sandbox() is not None)

    def _waiting(self, ctx: PodContext, problem: str) -> Result:
        message = f"Failed to prepare dynamic resources: {problem}"
        if ctx.stash.get(_WAITING) != message:
            ctx.log.warning("DRA preparation failed; will retry", error=problem)
        ctx.stash[_WAITING] = message
        ctx.status.set_pod_reason(REASON, message)
        return Result.retry(REASON, message)

    async def _resolve_cdi(self) -> bool:
        if self.config.resolve_cdi != "auto":
            return self.config.resolve_cdi == "always"
        info = getattr(self._handle.runtime, "runtime_version", None)
        if info is None or info.runtime_name != "containerd":
            return True
        found = re.match(r"v?(\d+)\.", info.runtime_version)
        return found is None or int(found.group(1)) < 2

    async def _report_skipped(self, ctx: PodContext, table: Mapping[str, containers.Contribution]) -> None:
        skipped = {name: part.skipped for name, part in table.items() if part.skipped}
        if not skipped:
            return
        for container, edits in skipped.items():
            ctx.log.warning("CDI edits CRI cannot express were not applied", container=container, edits=edits)
            await ctx.publish(CdiEditsSkipped(container=container, edits=edits))
        ctx.status.set_condition(CDI_CONDITION, True, "CDIEditsNotExpressible",
                                 "; ".join(f"{c}: {', '.join(e)}" for c, e in skipped.items()))

    # --- unprepare ----------------------------------------------------------------------

    async def unprepare(self, ctx: PodContext) -> None:
        await self._ensure_loaded()
        ctx.additions.withdraw()
        if ctx.stash.pop(_WAITING, None) is not None:
            ctx.status.set_pod_reason("", "")  # a pod deleted while waiting did not fail because of it
        uid = ctx.ref.uid
        self._active.discard(uid)
        mine = self.cache.of_pod(uid)
        if not mine:
            return
        for entry in mine:
            entry.pod_uids.discard(uid)
        await self._save()
        await self._unprepare_unused(ctx)

    async def _unprepare_unused(self, ctx: PodContext | None = None) -> None:
        """NodeUnprepareResources for every claim no pod uses; a failure keeps the claim for the
        reconcile loop to try again (the undo phase itself runs once)."""
        unused = [e for e in self.cache.entries.values() if not e.pod_uids]
        if not unused:
            return
        async with self._locked([e.uid for e in unused]):
            unused = [e for e in unused if not e.pod_uids and self.cache.entries.get(e.uid) is e]
            by_driver: dict[str, list[ClaimEntry]] = {}
            for entry in unused:
                for driver_name in entry.drivers:
                    by_driver.setdefault(driver_name, []).append(entry)
            failed: set[str] = set()
            for name, entries in by_driver.items():
                keys = [e.key for e in entries]
                driver = self.drivers.get(name)
                if driver is None:
                    log.warning("cannot unprepare ResourceClaims: DRA driver is not registered; will retry",
                                driver=name, claims=keys)
                    failed |= {e.uid for e in entries}
                    continue
                try:
                    answers = await driver.client.unprepare([e.claim for e in entries])
                except api.DriverCallError as exc:
                    log.warning("NodeUnprepareResources failed; will retry", driver=name, claims=keys, error=str(exc))
                    failed |= {e.uid for e in entries}
                    continue
                done = []
                for entry in entries:
                    if answers[entry.uid]:
                        log.warning("NodeUnprepareResources failed for a claim; will retry", driver=name,
                                    claim=entry.key, error=answers[entry.uid])
                        failed.add(entry.uid)
                    else:
                        done.append(entry.key)
                if done:
                    event = DevicesUnprepared(driver=name, claims=done)
                    await (ctx.publish(event) if ctx is not None else
                           self._handle.publish(event.model_copy(update={"source": self.name})))
            for entry in unused:
                if entry.uid not in failed:
                    del self.cache.entries[entry.uid]
            await self._save()

    # --- helpers ------------------------------------------------------------------------

    async def _save(self) -> None:
        await anyio.to_thread.run_sync(self.cache.save)

    def _locked(self, uids: list[str]) -> _Locks:
        return _Locks([self._locks.setdefault(u, anyio.Lock()) for u in sorted(set(uids))])


class _Locks:
    """Per-claim locks, taken in UID order (no deadlock between pods sharing claims): two pods
    that share a claim never prepare or unprepare it at once, pods that do not never wait for
    each other."""

    def __init__(self, locks: list[anyio.Lock]) -> None:
        self._locks = locks
        self._held: list[anyio.Lock] = []

    async def __aenter__(self) -> None:
        for lock in self._locks:
            await lock.acquire()
            self._held.append(lock)

    async def __aexit__(self, *exc: object) -> None:
        for lock in reversed(self._held):
            lock.release()
        self._held.clear()


def plugin(config: DraConfig, handle: AgentHandle) -> DraStage:
    return DraStage(config, handle)


plugin.stage_class = DraStage  # type: ignore[attr-defined]
plugin.config_model = DraConfig  # type: ignore[attr-defined]
__all__ = ["DraConfig", "DraStage", "plugin"]
